// Tensors that share another tensor's memory without being autograd views.
#pragma once

#include <torch/types.h>

namespace dtrain::detail {

// Elements [offset, offset + numel(sizes)) of the contiguous `buffer`, shaped
// `sizes`. Shares the buffer's storage but is not an autograd view of it, so
// LibTorch's Optimizer::zero_grad() (which calls detach_() on gradients,
// refused on views) works on gradients that live inside a flat buffer.
torch::Tensor alias_of(const torch::Tensor& buffer, int64_t offset, c10::IntArrayRef sizes);

// A tensor of `sizes` whose storage has no bytes yet: a deferred parameter
// (dtrain/deferred_init.h) or a freed FSDP full buffer. Reading it fails
// (LibTorch: "data is not allocated yet") until its storage gets bytes.
torch::Tensor storageless(c10::IntArrayRef sizes, const torch::TensorOptions& options);

}  // namespace dtrain::detail
