// The start of a run replayed as dtrain train runs it, counting bytes.
//
// Note [construction plan]
// - Sharded strategies (src/train/model.cpp builds the model deferred;
//   src/fsdp/fsdp_state.cpp, flat_parameter.cpp, src/models/deferred_init.cpp):
//   * each leaf module (a Linear, an Embedding, ...) is built at full size
//     by LibTorch and at once loses its storage, so one module exists at a
//     time;
//   * fully_shard then builds the units in order (the root first): a unit
//     allocates its zeroed shard, then materialises its modules one at a
//     time (full size, initialised, this rank's pieces copied into the
//     shard, freed);
//   * buffers (BatchNorm statistics) are materialised whole and broadcast
//     from rank 0 (one packed copy);
//   * --init-from reads this rank's pieces straight into the shards.
// - DDP and single process: the whole model, then DDP broadcasts rank 0's
//   weights as one packed copy per dtype and allocates one bucket element
//   per parameter element; --init-from then reads the whole file.
// Module boundaries come from the parameter names ("blocks.0.qkv.weight"
// belongs to "blocks.0.qkv").
#include "plan/plan_internal.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::plan::detail {
namespace {

std::string module_of(const std::string& parameter) {
  const auto dot = parameter.rfind('.');
  return dot == std::string::npos ? std::string() : parameter.substr(0, dot);
}

// The unit's modules in parameter order, with their elements.
std::vector<std::pair<std::string, int64_t>> modules_of(const UnitSpec& unit) {
  std::vector<std::pair<std::string, int64_t>> modules;
  for (const auto& p : unit.parameters) {
    const std::string module = module_of(p.name);
    if (modules.empty() || modules.back().first != module) modules.emplace_back(module, 0);
    modules.back().second += p.numel;
  }
  return modules;
}

struct Replay {
  MemoryBreakdown now, peak;
  std::string moment;
  void mark(const std::string& what) {
    if (now.total() > peak.total() || moment.empty()) {
      peak = now;
      moment = what;
    }
  }
};

}  // namespace

void simulate_construction(const ModelSpec& model, const Layout& layout, bool init_from, Plan& plan) {
  Replay r;
  const int64_t master = layout.master_bytes;
  if (layout.ddp || layout.strategy == Sharding::None) {
    int64_t params = 0;
    for (const auto& unit : model.units) params += unit.numel() * master;
    r.now.parameters = params + model.buffer_bytes;
    r.mark("construction: the whole model");
    if (layout.world_size > 1) {
      r.now.gathered_parameters = params + model.buffer_bytes;
      r.mark("construction: rank 0's weights broadcast (one packed copy)");
      r.now.gathered_parameters = 0;
    }
    if (layout.ddp) {
      r.now.reduction_buffers = params;
      r.mark("construction: DDP's buckets");
    }
    if (init_from) {
      r.now.gathered_parameters = params + model.buffer_bytes;
      r.mark("load of --init-from: the whole file");
      r.now.gathered_parameters = 0;
    }
  } else {
    // Building the model deferred: one leaf module at a time.
    for (const auto& unit : model.units) {
      for (const auto& [name, numel] : modules_of(unit)) {
        r.now.gathered_parameters = numel * master;
        r.mark("construction: LibTorch builds '" + name + "' before it is deferred");
      }
    }
    r.now.gathered_parameters = 0;
    // fully_shard: unit by unit, module by module.
    for (const auto& unit : model.units) {
      const auto flat = flat_layout(unit, layout);
      r.now.parameters += flat.shard * master;
      for (const auto& [name, numel] : modules_of(unit)) {
        r.now.gathered_parameters = numel * master;
        r.mark("construction: '" + name + "' materialised, to be cut into this rank's pieces");
      }
      r.now.gathered_parameters = 0;
    }
    r.now.parameters += model.buffer_bytes;
    if (model.buffer_bytes > 0 && layout.world_size > 1) {
      r.now.gathered_parameters = model.buffer_bytes;
      r.mark("construction: buffers broadcast from rank 0");
      r.now.gathered_parameters = 0;
    }
    r.mark(init_from ? "load of --init-from (straight into the shards)" : "construction: done");
  }
  plan.construction = r.peak;
  plan.construction_moment = r.moment;
}

}  // namespace dtrain::plan::detail
