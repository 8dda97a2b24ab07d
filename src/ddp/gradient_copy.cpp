#include "ddp/gradient_copy.h"

#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/cat.h>
#include <torch/utils.h>

namespace dtrain::detail {

bool can_be_slot(const torch::Tensor& grad, const torch::Tensor& slot) {
  return grad.defined() && grad.layout() == torch::kStrided && grad.scalar_type() == slot.scalar_type() &&
         grad.device() == slot.device() && grad.sizes() == slot.sizes() && grad.is_contiguous();
}

void stage(Bucket& bucket, int position, torch::Tensor grad) {
  auto& staged = bucket.staged[position];
  if (!staged.defined()) ++bucket.staged_count;
  staged = std::move(grad);
}

std::vector<int> copy_staged(Bucket& bucket) {
  torch::NoGradGuard no_grad;
  std::vector<int> positions;
  if (bucket.staged_count == 0) return positions;
  std::vector<torch::Tensor> dst, src;
  bool whole_buffer = bucket.staged_count == static_cast<int>(bucket.members.size());
  for (size_t k = 0; k < bucket.staged.size(); ++k) {
    auto& grad = bucket.staged[k];
    if (!grad.defined()) continue;
    positions.push_back(static_cast<int>(k));
    whole_buffer = whole_buffer && can_be_slot(grad, bucket.grads.gradients[k]);
    dst.push_back(bucket.grads.gradients[k]);
    src.push_back(std::move(grad));
    grad = torch::Tensor();
  }
  bucket.staged_count = 0;
  if (whole_buffer) {
    // Every slot, in slot order, contiguous: the buffer is their concatenation.
    for (auto& g : src) g = g.view({-1});
    at::cat_out(bucket.grads.buffer, src);
  } else {
    copy_all(dst, src);
  }
  return positions;
}

void copy_all(const std::vector<torch::Tensor>& dst, const std::vector<torch::Tensor>& src) {
  if (dst.empty()) return;
  torch::NoGradGuard no_grad;
  if (dst.size() == 1) {
    dst[0].copy_(src[0]);
    return;
  }
  at::_foreach_copy_(dst, src);
}

}  // namespace dtrain::detail
