// The public face of FSDP (include/dtrain/fsdp.h) over FSDPState.
#include "fsdp/fsdp_state.h"

#include <dtrain/grad_norm.h>
#include <dtrain/fsdp.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <map>
#include <mutex>
#include <stdexcept>

namespace dtrain {

const char* to_string(Sharding sharding) {
  switch (sharding) {
    case Sharding::Full: return "full";
    case Sharding::GradOp: return "gradop";
    case Sharding::OptimizerOnly: return "optimizer";
    case Sharding::None: return "none";
    case Sharding::Hybrid: return "hybrid";
  }
  return "?";
}

Sharding sharding_from_string(const std::string& name) {
  static const std::map<std::string, Sharding> names = {
      {"full", Sharding::Full},      {"fsdp", Sharding::Full},          {"zero3", Sharding::Full},
      {"gradop", Sharding::GradOp},  {"zero2", Sharding::GradOp},       {"optimizer", Sharding::OptimizerOnly},
      {"zero1", Sharding::OptimizerOnly}, {"none", Sharding::None},     {"ddp", Sharding::None},
      {"hybrid", Sharding::Hybrid},  {"hsdp", Sharding::Hybrid}};
  auto it = names.find(name);
  if (it == names.end()) {
    throw std::invalid_argument("unknown sharding strategy '" + name +
                                "'; allowed: full (fsdp, zero3), gradop (zero2), optimizer (zero1), none (ddp), "
                                "hybrid (hsdp)");
  }
  return it->second;
}

namespace detail {

torch::Tensor run_unit(const torch::nn::Module* module,
                       const std::function<torch::Tensor(const torch::Tensor&)>& forward, const torch::Tensor& input) {
  auto [state, unit] = lookup_unit(module);
  if (!unit) return forward(input);
  return state->forward_unit(*unit, forward, input);
}

}  // namespace detail

FullyShardedBase::FullyShardedBase(std::shared_ptr<torch::nn::Module> root, CommPtr comm, FSDPOptions options)
    : state_(std::make_unique<detail::FSDPState>(std::move(root), std::move(comm), std::move(options))) {}
FullyShardedBase::~FullyShardedBase() = default;
FullyShardedBase::FullyShardedBase(FullyShardedBase&&) noexcept = default;
FullyShardedBase& FullyShardedBase::operator=(FullyShardedBase&&) noexcept = default;

FullyShardedBase::NoSyncGuard::NoSyncGuard(FullyShardedBase& fsdp) : fsdp_(fsdp), previous_(fsdp.state_->sync()) {
  fsdp_.state_->set_sync(false);
}
FullyShardedBase::NoSyncGuard::~NoSyncGuard() { fsdp_.state_->set_sync(previous_); }

const FSDPOptions& FullyShardedBase::options() const { return state_->options(); }
const CommPtr& FullyShardedBase::comm() const { return state_->comm(); }
Communicator& FullyShardedBase::shard_group() const { return state_->shard_group(); }

std::vector<FSDPUnitInfo> FullyShardedBase::units() const {
  std::vector<FSDPUnitInfo> infos;
  for (const auto& unit : state_->units()) {
    FSDPUnitInfo info{unit->name(), unit->flat().numel(), unit->flat().padded_numel(), unit->flat().shard_numel(), {}};
    for (const auto& entry : unit->flat().entries()) info.parameters.push_back(entry.name);
    infos.push_back(std::move(info));
  }
  return infos;
}

std::vector<torch::Tensor> FullyShardedBase::parameters() const { return state_->root()->parameters(); }

void FullyShardedBase::gather_for_step(bool per_microbatch) { state_->gather_for_step(per_microbatch); }
void FullyShardedBase::reduce_step_gradients() { state_->reduce_step_gradients(); }

std::vector<FSDPParameterShard> FullyShardedBase::parameter_shards() const {
  std::vector<FSDPParameterShard> shards;
  for (const auto& unit : state_->units()) {
    for (const auto& entry : unit->flat().entries()) {
      shards.push_back({entry.name, entry.shape, entry.local_begin, entry.local_begin + entry.local_count, entry.param});
    }
  }
  return shards;
}

const std::shared_ptr<torch::nn::Module>& FullyShardedBase::root_module() const { return state_->root(); }

FSDPPrefetchTuning FullyShardedBase::prefetch_tuning() const { return state_->prefetch_tuning(); }

int64_t FullyShardedBase::sharded_parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto& unit : state_->units()) {
    for (const auto& entry : unit->flat().entries()) {
      const auto& p = entry.param;
      bytes += p.numel() * static_cast<int64_t>(p.element_size());
      if (p.grad().defined()) bytes += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
    }
  }
  return bytes;
}

FSDPStepStats FullyShardedBase::last_step() const { return state_->last_step(); }

std::map<std::string, torch::Tensor> FullyShardedBase::full_state_dict(bool rank0_only) {
  torch::NoGradGuard no_grad;
  auto& group = state_->shard_group();
  const bool keep = !rank0_only || state_->comm()->rank() == 0;
  std::map<std::string, torch::Tensor> result;
  for (const auto& unit : state_->units()) {
    const auto& flat = unit->flat();
    if (flat.entries().empty()) continue;
    auto full = torch::empty({flat.padded_numel()}, flat.shard().options());
    group.blocking().all_gather(flat.shard(), full);
    if (!keep) continue;
    for (const auto& entry : flat.entries()) {
      result[entry.name] = full.narrow(0, entry.offset, entry.numel).view(entry.shape).clone();
    }
  }
  if (keep) {
    for (const auto& item : state_->root()->named_buffers(true)) result[item.key()] = item.value().detach().clone();
  }
  return result;
}

torch::Tensor FullyShardedBase::forward_root(const std::function<torch::Tensor()>& forward) {
  return state_->forward_root(forward);
}

torch::Tensor FullyShardedBase::forward_sequential(const torch::Tensor& input) {
  auto* sequential = state_->root()->as<torch::nn::SequentialImpl>();
  return state_->forward_root([&] {
    torch::Tensor x = state_->to_compute_dtype(input);
    for (auto& child : *sequential) {
      detail::Unit* unit = state_->unit_for(child.ptr().get());
      auto run = [&child](const torch::Tensor& value) { return child.forward(value); };
      x = unit ? state_->forward_unit(*unit, run, x) : run(x);
    }
    return x;
  });
}

torch::Tensor FullyShardedBase::compute_input(const torch::Tensor& input) const {
  return state_->to_compute_dtype(input);
}

double clip_grad_norm(FullyShardedBase& fsdp, double max_norm, double norm_type) {
  // Shards are disjoint within the sharding group and identical across
  // hybrid replicas, so the group's sum is the global norm.
  return clip_grad_norm(fsdp.parameters(), max_norm, norm_type, &fsdp.shard_group());
}

}  // namespace dtrain
