// What one rank holds of a model and its optimizer, as pieces of flattened
// global tensors: the common view that sharded save and load work on,
// whatever the parallelism (single process, DDP, FSDP/ZeRO).
#pragma once

#include "checkpoint/optimizer_state_names.h"

#include <dtrain/checkpoint.h>
#include <dtrain/comm.h>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtrain {
class FullyShardedBase;
}

namespace dtrain::detail {

// Elements [begin, end) of the flattened global tensor `name`, held by this
// rank as the 1-D tensor `flat` (a view: writing it changes the model).
// `replicas` ranks hold the same elements; this rank is copy `replica`.
struct HeldTensor {
  std::string name;
  std::vector<int64_t> shape;  // global
  int64_t begin = 0, end = 0;
  torch::Tensor flat;
  int replicas = 1, replica = 0;
  torch::Tensor parameter;  // for parameters: the tensor optimizers key their state by
};

struct HeldModel {
  std::string strategy;
  int rank = 0, world_size = 1;
  std::vector<HeldTensor> tensors;  // parameters, then buffers
};

HeldModel held_by_module(torch::nn::Module& module, const CommPtr& comm);
HeldModel held_by_fsdp(FullyShardedBase& fsdp);

// "adamw", "adam", "sgd", or "none" for nullptr; throws for other optimizers.
std::string optimizer_kind(const torch::optim::Optimizer* optimizer);


// The optimizer's state for `parameter`, by key: element-wise tensors
// flattened (1-D, the parameter's elements), and "step" as a one-element
// int64 tensor. Empty when the optimizer has no state for it yet.
std::vector<std::pair<std::string, torch::Tensor>> optimizer_state_of(torch::optim::Optimizer& optimizer,
                                                                     const torch::Tensor& parameter);
// Replaces the optimizer's state for `parameter` with `values` (keys as
// above; element-wise values 1-D with the parameter's numel).
void set_optimizer_state(torch::optim::Optimizer& optimizer, const torch::Tensor& parameter,
                         const std::map<std::string, torch::Tensor>& values);

}  // namespace dtrain::detail
