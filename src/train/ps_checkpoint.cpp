#include "train/ps_checkpoint.h"

#include <torch/types.h>

#include <set>

namespace dtrain::train {
namespace {

HeldModel held_base(const ps::Group& group, const std::string& strategy) {
  HeldModel held;
  held.strategy = strategy;
  held.rank = group.world()->rank();
  held.world_size = group.world()->size();
  return held;
}

HeldTensor whole(const std::string& name, const torch::Tensor& tensor) {
  return {.name = name, .shape = tensor.sizes().vec(), .begin = 0, .end = tensor.numel(),
          .flat = tensor.detach().view({-1}), .parameter = {}, .runs = {}};
}

HeldTensor empty_piece(const std::string& name, const torch::Tensor& tensor) {
  return {.name = name, .shape = tensor.sizes().vec(), .flat = torch::empty({0}, tensor.options()), .parameter = {}, .runs = {}};
}

}  // namespace

HeldModel ps_worker_held(torch::nn::Module& module, const ps::Group& group, const std::string& strategy,
                         const std::string& optimizer, HeldFor use) {
  HeldModel held = held_base(group, strategy);
  held.optimizer_kind = optimizer;
  if (use == HeldFor::Loading) {
    // The whole model, as a replica: the servers' values, which the servers
    // load too, and this worker's copy agrees with theirs.
    for (const auto& item : module.named_parameters(true)) held.tensors.push_back(whole(item.key(), item.value()));
  }
  // Buffers: the workers never exchange them (a BatchNorm's running
  // statistics differ per worker), so worker 0's are saved, whole; every
  // worker loads them.
  if (use == HeldFor::Loading || group.worker_index() == 0)
    for (const auto& item : module.named_buffers(true)) held.tensors.push_back(whole(item.key(), item.value()));
  return held;
}

HeldModel ps_server_held(torch::nn::Module& module, const ps::Group& group, const ps::Server& server,
                         const std::string& strategy, HeldFor use) {
  HeldModel held = held_base(group, strategy);
  const auto parameters = module.named_parameters(true);
  std::set<size_t> mine;
  for (const auto& slice : server.slices()) {
    const auto& item = parameters[slice.index];
    held.tensors.push_back({.name = item.key(),
                            .shape = item.value().sizes().vec(),
                            .begin = slice.begin,
                            .end = slice.end,
                            .flat = slice.values.detach(),
                            .parameter = slice.values,
                            .runs = {}});
    mine.insert(slice.index);
  }
  if (use == HeldFor::Loading) {
    for (size_t i = 0; i < parameters.size(); ++i)
      if (!mine.count(i)) held.tensors.push_back(empty_piece(parameters[i].key(), parameters[i].value()));
    for (const auto& item : module.named_buffers(true)) held.tensors.push_back(empty_piece(item.key(), item.value()));
  }
  return held;
}

}  // namespace dtrain::train
