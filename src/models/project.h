// The built-in models' linear layers, called through dtrain::linear so that
// --fp8 takes them (dtrain/float8.h).
#pragma once

#include <dtrain/float8.h>

#include <torch/nn/modules/linear.h>

namespace dtrain::models::detail {

// layer(x), in fp8 where the run's --fp8 settings take the layer.
inline torch::Tensor project(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return dtrain::linear(x, layer->weight, layer->bias);
}

}  // namespace dtrain::models::detail
