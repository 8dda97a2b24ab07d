// Note [the loss one step late] (late_scalar.h).
#include "train/late_scalar.h"

#include "dtrain/trace.h"

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <stdexcept>

namespace dtrain::train {

LateScalar::LateScalar() = default;
LateScalar::~LateScalar() = default;
LateScalar::LateScalar(LateScalar&&) noexcept = default;
LateScalar& LateScalar::operator=(LateScalar&&) noexcept = default;

LateScalar::LateScalar(const torch::Tensor& value) {
  if (value.numel() != 1) throw std::invalid_argument("LateScalar: a tensor of one element, not " + c10::str(value.sizes()));
  if (!value.is_cuda()) {
    host_ = value.detach().reshape({1}).clone();  // a CPU value is ready now; the clone outlives in-place changes
    return;
  }
  // Non-blocking to the host: into pinned memory, ordered on the current stream.
  host_ = value.detach().reshape({1}).to(torch::kCPU, /*non_blocking=*/true);
  const c10::Device device = value.device();
  copied_ = std::make_unique<c10::Event>(c10::DeviceType::CUDA);
  copied_->record(c10::impl::getDeviceGuardImpl(device.type())->getStream(device));
}

double LateScalar::take() {
  if (!pending()) throw std::logic_error("LateScalar::take: nothing pending");
  if (copied_) {
    trace::Span span("loss_read", trace::category::wait);
    copied_->synchronize();
  }
  const double value = host_.item<double>();
  host_ = torch::Tensor();
  copied_.reset();
  return value;
}

}  // namespace dtrain::train
