// The flat parameter vector a parameter-server job shards: every parameter
// flattened and concatenated in parameters() order, float32, on the CPU.
// Internal (include/dtrain/ps.h).
#pragma once

#include "dtrain/ps.h"

#include <torch/types.h>

#include <vector>

namespace dtrain::ps {

// Collective over the world: checks that every rank has the same number of
// parameter elements (all float32) and returns world rank 0's values as one
// flat CPU tensor.
torch::Tensor agree_on_initial_parameters(const Group& group, const std::vector<torch::Tensor>& parameters);

// The gradients as one flat CPU float32 tensor (a missing grad is zeros).
torch::Tensor flatten_gradients(const std::vector<torch::Tensor>& parameters);

// Copies `flat` back into the parameters (without autograd recording it).
void copy_into_parameters(const torch::Tensor& flat, const std::vector<torch::Tensor>& parameters);

}  // namespace dtrain::ps
