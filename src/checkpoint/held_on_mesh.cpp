// What a rank of a (dp, pp, tp) mesh holds of the global tensors
// (dtrain::held_on_mesh, include/dtrain/checkpoint.h): the view of its
// data-parallel engine (DDP's replica or FSDP's shards, over the dp group),
// with each tensor-parallel slice placed in its global tensor, the
// replicated tensors counted as copies across the tp group too, and the
// other pipeline stages' tensors listed empty.
#include "checkpoint/held_state.h"
#include "checkpoint/rank_agreement.h"

#include <dtrain/checkpoint.h>
#include <dtrain/fsdp.h>
#include <dtrain/mesh.h>
#include <dtrain/tensor_parallel.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>

namespace dtrain {
namespace {

// A view the dp engine built over its group, made one of the mesh's whole
// world (the save and load are over mesh.world()). The manifest names the
// data-parallel engine; one replica over dp (a single-process model split
// over tp or pp) is laid out as DDP's.
void over_the_world(HeldModel& held, const DeviceMesh& mesh) {
  held.rank = mesh.world()->rank();
  held.world_size = mesh.world()->size();
  if (held.strategy == "single" && held.world_size > 1) held.strategy = "ddp";
}

// Tensor parallelism: each slice placed in its global tensor; the
// replicated tensors counted as copies across the tp group too.
void place_tensor_parallel(HeldModel& held, const torch::nn::Module& root, const DeviceMesh& mesh) {
  const auto places = tp::parameter_places(root);
  const int tp_rank = mesh.rank("tp"), tp_size = mesh.size("tp");
  for (HeldTensor& tensor : held.tensors) {
    auto place = places.find(tensor.name);
    if (place == places.end()) {
      // Replicated across the tp group as well: copy `replica` of the dp
      // engine's copies, on each of the group's ranks.
      tensor.replica = tensor.replica * tp_size + tp_rank;
      tensor.replicas *= tp_size;
      continue;
    }
    // The engine's elements [begin, end) of the local slice, in the global tensor.
    int64_t local = 1;
    for (int64_t d : tensor.shape) local *= d;
    if (numel_of(place->second.runs) != local) {
      throw std::runtime_error("held_on_mesh: '" + tensor.name + "' is " + c10::str(c10::IntArrayRef(tensor.shape)) +
                               " on this rank, not the slice of " +
                               c10::str(c10::IntArrayRef(place->second.global_shape)) + " its layer describes");
    }
    tensor.runs = sub_runs(place->second.runs, tensor.begin, tensor.end);
    tensor.shape = place->second.global_shape;
  }
}

// Pipeline parallelism: a tensor several stages hold (GPT's tied wte) is a
// copy on each, and the other stages' tensors are listed as empty pieces
// (named, so that a load checks them), from `whole`'s names and shapes.
void place_pipeline(HeldModel& held, const torch::nn::Module& whole, const DeviceMesh& mesh) {
  // Which stages hold each name: every stage's names, gathered over pp.
  std::string mine;
  for (const auto& tensor : held.tensors) mine += tensor.name + "\n";
  std::map<std::string, std::vector<int>> holders;
  const auto all = detail::all_gather_strings(mesh.comm("pp"), mine);
  for (size_t s = 0; s < all.size(); ++s) {
    std::istringstream names(all[s]);
    for (std::string name; std::getline(names, name);) holders[name].push_back(static_cast<int>(s));
  }
  const int pp_rank = mesh.rank("pp");
  for (HeldTensor& tensor : held.tensors) {
    // Copy `replica` of the other dimensions' copies, on the k-th of the stages that hold it.
    const auto& stages = holders.at(tensor.name);
    const int k = static_cast<int>(std::find(stages.begin(), stages.end(), pp_rank) - stages.begin());
    tensor.replica = k * tensor.replicas + tensor.replica;
    tensor.replicas *= static_cast<int>(stages.size());
  }
  std::map<std::string, bool> held_here;
  for (const auto& tensor : held.tensors) held_here[tensor.name] = true;
  auto add_empty = [&](const std::string& name, const torch::Tensor& value) {
    if (held_here.count(name)) return;
    held.tensors.push_back({name, value.sizes().vec(), 0, 0, torch::empty({0}, torch::TensorOptions().dtype(value.scalar_type())),
                            1, 0, torch::Tensor(), {}});
  };
  for (const auto& item : whole.named_parameters(true)) add_empty(item.key(), item.value());
  for (const auto& item : whole.named_buffers(true)) add_empty(item.key(), item.value());
}

HeldModel place_on_mesh(HeldModel held, const torch::nn::Module& root, const DeviceMesh& mesh,
                        const torch::nn::Module* whole) {
  bool known = mesh.has("dp");
  for (const auto& dim : mesh.dims()) known = known && (dim.first == "dp" || dim.first == "pp" || dim.first == "cp" || dim.first == "tp");
  if (!known)
    throw std::invalid_argument("held_on_mesh: the mesh " + mesh.describe() + " is not (dp[, pp][, cp][, tp])");
  if (mesh.has("cp") && !mesh.has_comm("dp_cp"))
    throw std::invalid_argument("held_on_mesh: a mesh with cp needs its dp x cp group: call mesh.flatten({\"dp\", "
                                "\"cp\"}, \"dp_cp\") on every rank first (the cp ranks hold copies)");
  if (mesh.has("pp") && whole == nullptr)
    throw std::invalid_argument("held_on_mesh: a mesh with pp needs the whole model (for the other stages' names)");
  over_the_world(held, mesh);
  if (mesh.has("tp")) place_tensor_parallel(held, root, mesh);
  if (mesh.has("pp")) place_pipeline(held, *whole, mesh);
  return held;
}

}  // namespace

HeldModel held_on_mesh(torch::nn::Module& module, const DeviceMesh& mesh, const torch::nn::Module* whole) {
  // With cp the replicas are over dp x cp (the cp ranks hold the same parameters).
  return place_on_mesh(detail::held_by_module(module, mesh.comm(mesh.has("cp") ? "dp_cp" : "dp")), module, mesh, whole);
}

HeldModel held_on_mesh(FullyShardedBase& fsdp, const DeviceMesh& mesh, const torch::nn::Module* whole) {
  return place_on_mesh(detail::held_by_fsdp(fsdp), *fsdp.root_module(), mesh, whole);
}

HeldModel held_on_pipeline(torch::nn::Module& stage, const torch::nn::Module& whole, const DeviceMesh& mesh) {
  return held_on_mesh(stage, mesh, &whole);
}

}  // namespace dtrain
