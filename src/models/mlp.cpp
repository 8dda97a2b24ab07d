#include "dtrain/models.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>

#include <stdexcept>
#include <string>

namespace dtrain::models {

namespace {
constexpr int64_t kPixels = 28 * 28;
constexpr int64_t kClasses = 10;
}  // namespace

MLPImpl::MLPImpl(std::vector<int64_t> hidden_sizes, double dropout) {
  if (dropout < 0.0 || dropout >= 1.0)
    throw std::invalid_argument("MLP: dropout must be in [0, 1), got " + std::to_string(dropout));
  // A Sequential, so that FSDP can wrap its children one by one.
  layers_ = register_module("layers", torch::nn::Sequential());
  layers_->push_back(torch::nn::Flatten());
  int64_t width = kPixels;
  for (int64_t hidden : hidden_sizes) {
    if (hidden <= 0) throw std::invalid_argument("MLP: hidden sizes must be positive, got " + std::to_string(hidden));
    layers_->push_back(deferred(torch::nn::Linear(width, hidden)));
    layers_->push_back(torch::nn::ReLU());
    // No Dropout module when it would do nothing: it would still be a layer
    // for FSDP to walk over and for printouts to show.
    if (dropout > 0.0) layers_->push_back(torch::nn::Dropout(dropout));
    width = hidden;
  }
  layers_->push_back(deferred(torch::nn::Linear(width, kClasses)));
  initialize_unless_deferred(*this);
}

torch::Tensor MLPImpl::forward(torch::Tensor images) {
  check_materialized(layers_->ptr(layers_->size() - 1)->parameters().front(), "MLP");
  return layers_->forward(images);
}

}  // namespace dtrain::models
