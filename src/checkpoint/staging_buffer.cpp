// See Note [staging buffer] in staging_buffer.h.
#include "checkpoint/staging_buffer.h"

#include <vector>

namespace dtrain::detail {
namespace {

// Every copy starts on a 64-byte boundary: any dtype's view is aligned.
constexpr int64_t kAlignment = 64;

int64_t aligned(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

void StagingBuffer::stage(RankFile& file) {
  torch::NoGradGuard no_grad;
  int64_t needed = 0;
  bool on_device = false;
  for (const auto& [name, tensor] : file.tensors) {
    needed += aligned(static_cast<int64_t>(tensor.nbytes()));
    on_device = on_device || !tensor.device().is_cpu();
  }
  if (bytes() < needed) {
    buffer_ = torch::Tensor();  // the old one goes before the new one comes
    buffer_ = torch::empty({needed}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(on_device));
    ++allocations_;
  }
  int64_t offset = 0;
  for (auto& [name, tensor] : file.tensors) {
    const auto nbytes = static_cast<int64_t>(tensor.nbytes());
    torch::Tensor copy = buffer_.narrow(0, offset, nbytes).view(tensor.scalar_type()).view(tensor.sizes());
    copy.copy_(tensor);
    tensor = copy;
    offset += aligned(nbytes);
  }
}

}  // namespace dtrain::detail
