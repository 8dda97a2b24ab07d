#include "common/tensor_alias.h"

#include <torch/types.h>
#include <torch/utils.h>

namespace dtrain::detail {

torch::Tensor alias_of(const torch::Tensor& buffer, int64_t offset, c10::IntArrayRef sizes) {
  torch::NoGradGuard no_grad;
  return torch::empty({0}, buffer.options()).set_(buffer.storage(), buffer.storage_offset() + offset, sizes);
}

torch::Tensor storageless(c10::IntArrayRef sizes, const torch::TensorOptions& options) {
  auto tensor = torch::empty({0}, options);
  tensor.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return tensor;
}

}  // namespace dtrain::detail
