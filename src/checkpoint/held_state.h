// What one rank holds of a model and its optimizer, as pieces of flattened
// global tensors: the common view that sharded save and load work on,
// whatever the parallelism (single process, DDP, FSDP/ZeRO, the parameter
// server). The view itself (HeldModel, HeldTensor) is public, in
// dtrain/checkpoint.h, so that other engines can build theirs.
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

using dtrain::HeldModel;
using dtrain::HeldTensor;

HeldModel held_by_module(torch::nn::Module& module, const CommPtr& comm);
HeldModel held_by_fsdp(FullyShardedBase& fsdp);

// The elements of the global tensor `tensor.flat` holds, in order: its runs,
// or the one run [begin, end).
std::vector<FlatRun> global_runs(const HeldTensor& tensor);

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
