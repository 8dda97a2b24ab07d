// Activation checkpointing for one unit: run its forward without keeping
// activations, and run it again during backward to get them back.
#pragma once

#include <torch/types.h>

#include <functional>

namespace dtrain::detail {

using UnitForward = std::function<torch::Tensor(const torch::Tensor&)>;

// Returns forward(input) computed under no_grad, wrapped in an autograd node
// whose backward recomputes forward(input) with gradients on (same RNG state,
// so dropout draws the same mask) and backpropagates through it. The unit's
// parameters must be gathered when that backward runs, which the unit's
// pre-backward hook on this output ensures. `forward` is copied and kept
// until the backward has run.
torch::Tensor checkpointed_forward(const UnitForward& forward, const torch::Tensor& input);

}  // namespace dtrain::detail
