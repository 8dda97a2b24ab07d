#include "dtrain/models.h"

namespace dtrain::models {

namespace {
torch::nn::Conv2d conv3x3(int64_t in_channels, int64_t out_channels) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in_channels, out_channels, 3).padding(1));
}
}  // namespace

// Registered in the order forward uses them, so parameters() lists them in
// forward order (DDP buckets gradients in the reverse of that order).
CNNImpl::CNNImpl()
    : conv1_(register_module("conv1", deferred(conv3x3(1, 16)))),
      norm1_(register_module("norm1", deferred(torch::nn::BatchNorm2d(16)))),
      conv2_(register_module("conv2", deferred(conv3x3(16, 32)))),
      norm2_(register_module("norm2", deferred(torch::nn::BatchNorm2d(32)))),
      hidden_(register_module("hidden", deferred(torch::nn::Linear(32 * 7 * 7, 64)))),
      output_(register_module("output", deferred(torch::nn::Linear(64, 10)))) {
  initialize_unless_deferred(*this);
}

torch::Tensor CNNImpl::forward(torch::Tensor images) {
  check_materialized(output_->weight, "CNN");
  auto x = torch::max_pool2d(torch::relu(norm1_->forward(conv1_->forward(images))), 2);  // 28 -> 14
  x = torch::max_pool2d(torch::relu(norm2_->forward(conv2_->forward(x))), 2);           // 14 -> 7
  x = torch::relu(hidden_->forward(x.flatten(1)));
  return output_->forward(x);
}

}  // namespace dtrain::models
