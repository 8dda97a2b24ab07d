#include "checkpoint/held_state.h"

#include <dtrain/fsdp.h>
#include <dtrain/strategy_table.h>

#include <torch/nn/module.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include <stdexcept>

namespace dtrain::detail {
namespace {

torch::Tensor flat_view(const torch::Tensor& tensor) {
  if (!tensor.is_contiguous()) {
    throw std::runtime_error("checkpoint: a tensor of shape " + c10::str(tensor.sizes()) +
                             " is not contiguous; save and load need contiguous parameters and buffers");
  }
  return tensor.detach().view({-1});
}

void add_buffers(HeldModel& held, torch::nn::Module& module) {
  for (const auto& item : module.named_buffers(true)) {
    held.tensors.push_back({item.key(), item.value().sizes().vec(), 0, item.value().numel(), flat_view(item.value()),
                            held.world_size, held.rank, torch::Tensor(), {}});
  }
}

}  // namespace

HeldModel held_by_module(torch::nn::Module& module, const CommPtr& comm) {
  HeldModel held;
  held.rank = comm ? comm->rank() : 0;
  held.world_size = comm ? comm->size() : 1;
  held.strategy = held.world_size > 1 ? "ddp" : "single";
  for (const auto& item : module.named_parameters(true)) {
    held.tensors.push_back({item.key(), item.value().sizes().vec(), 0, item.value().numel(), flat_view(item.value()),
                            held.world_size, held.rank, item.value(), {}});
  }
  add_buffers(held, module);
  return held;
}

HeldModel held_by_fsdp(FullyShardedBase& fsdp) {
  HeldModel held;
  held.rank = fsdp.comm()->rank();
  held.world_size = fsdp.comm()->size();
  held.strategy = strategy_of(fsdp.options().strategy).name;  // the strategy table's vocabulary
  // Shard groups are consecutive ranks (Hybrid: rank / group; None: groups
  // of one), so this rank is copy rank / group_size of its piece.
  const int group = fsdp.shard_group().size();
  const int replicas = held.world_size / group, replica = held.rank / group;
  for (const auto& shard : fsdp.parameter_shards()) {
    if (shard.parameter.dim() != 1 || shard.parameter.numel() != shard.end - shard.begin) {
      throw std::runtime_error("checkpoint: FSDP parameter '" + shard.name +
                               "' is not in its sharded form; save and load between training steps, not inside "
                               "forward or backward");
    }
    held.tensors.push_back(
        {shard.name, shard.shape, shard.begin, shard.end, shard.parameter.detach(), replicas, replica, shard.parameter, {}});
  }
  add_buffers(held, *fsdp.root_module());
  return held;
}

std::vector<FlatRun> global_runs(const HeldTensor& tensor) {
  if (!tensor.runs.empty()) return tensor.runs;
  return {{tensor.begin, tensor.end - tensor.begin, 0, 1}};
}

std::string optimizer_kind(const torch::optim::Optimizer* optimizer) {
  if (optimizer == nullptr) return "none";
  if (dynamic_cast<const torch::optim::AdamW*>(optimizer)) return "adamw";
  if (dynamic_cast<const torch::optim::Adam*>(optimizer)) return "adam";
  if (dynamic_cast<const torch::optim::SGD*>(optimizer)) return "sgd";
  throw std::runtime_error("checkpoint: only AdamW, Adam and SGD optimizer state can be saved; pass nullptr to save "
                           "the model alone");
}

namespace {

template <class State>
void adam_state_of(const State& state, std::vector<std::pair<std::string, torch::Tensor>>& out) {
  if (state.exp_avg().defined()) out.emplace_back("exp_avg", flat_view(state.exp_avg()));
  if (state.exp_avg_sq().defined()) out.emplace_back("exp_avg_sq", flat_view(state.exp_avg_sq()));
  if (state.max_exp_avg_sq().defined() && state.max_exp_avg_sq().numel() > 0) {
    out.emplace_back("max_exp_avg_sq", flat_view(state.max_exp_avg_sq()));
  }
  out.emplace_back("step", torch::tensor({state.step()}, torch::kInt64));
}

template <class State>
std::unique_ptr<State> adam_state_from(const torch::Tensor& parameter, const std::map<std::string, torch::Tensor>& values) {
  auto state = std::make_unique<State>();
  auto shaped = [&](const char* key) {
    auto it = values.find(key);
    return it == values.end() ? torch::Tensor() : it->second.view(parameter.sizes()).clone();
  };
  if (auto it = values.find("step"); it != values.end()) state->step(it->second.item<int64_t>());
  state->exp_avg(shaped("exp_avg"));
  state->exp_avg_sq(shaped("exp_avg_sq"));
  if (values.count("max_exp_avg_sq")) state->max_exp_avg_sq(shaped("max_exp_avg_sq"));
  if (!state->exp_avg().defined() || !state->exp_avg_sq().defined()) {
    throw std::runtime_error("checkpoint: Adam state without exp_avg or exp_avg_sq");
  }
  return state;
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> optimizer_state_of(torch::optim::Optimizer& optimizer,
                                                                     const torch::Tensor& parameter) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  auto it = optimizer.state().find(parameter.unsafeGetTensorImpl());
  if (it == optimizer.state().end() || !it->second) return out;
  const auto kind = optimizer_kind(&optimizer);
  if (kind == "adamw") {
    adam_state_of(static_cast<const torch::optim::AdamWParamState&>(*it->second), out);
  } else if (kind == "adam") {
    adam_state_of(static_cast<const torch::optim::AdamParamState&>(*it->second), out);
  } else if (kind == "sgd") {
    const auto& state = static_cast<const torch::optim::SGDParamState&>(*it->second);
    if (state.momentum_buffer().defined()) out.emplace_back("momentum_buffer", flat_view(state.momentum_buffer()));
  }
  return out;
}

void set_optimizer_state(torch::optim::Optimizer& optimizer, const torch::Tensor& parameter,
                         const std::map<std::string, torch::Tensor>& values) {
  const auto kind = optimizer_kind(&optimizer);
  std::unique_ptr<torch::optim::OptimizerParamState> state;
  if (kind == "adamw") {
    state = adam_state_from<torch::optim::AdamWParamState>(parameter, values);
  } else if (kind == "adam") {
    state = adam_state_from<torch::optim::AdamParamState>(parameter, values);
  } else if (kind == "sgd") {
    auto sgd = std::make_unique<torch::optim::SGDParamState>();
    sgd->momentum_buffer(values.at("momentum_buffer").view(parameter.sizes()).clone());
    state = std::move(sgd);
  }
  optimizer.state()[parameter.unsafeGetTensorImpl()] = std::move(state);
}

}  // namespace dtrain::detail
