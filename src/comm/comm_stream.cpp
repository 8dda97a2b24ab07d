// Communication streams (src/comm/comm_stream.h, Note [communication streams]).
#include "comm/comm_stream.h"

#include "common/device_spans.h"

#include <dtrain/comm.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace dtrain::detail {

namespace {

const c10::impl::DeviceGuardImplInterface& cuda() { return *c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA); }

// `waiter` waits for the work queued so far on `queued` (an event, no host sync).
void order(const c10::Stream& waiter, const c10::Stream& queued) {
  if (waiter == queued) return;
  c10::Event done(c10::DeviceType::CUDA);  // PYTORCH_DEFAULT: untimed, the cheapest kind
  done.record(queued);
  done.block(waiter);
}

void record_on(const at::Tensor& t, const c10::Stream& stream) {
  if (t.defined() && t.is_cuda() && t.has_storage()) t.record_stream(stream);
}

}  // namespace

CommStream::CommStream(const std::optional<c10::Device>& device, bool enabled, const char* lane) : lane_(lane) {
  if (!enabled || !device || !device->is_cuda()) return;
  // A device of its own index: the pool's streams belong to one device.
  const c10::Device on(c10::DeviceType::CUDA, device->has_index() ? device->index() : cuda().getDevice().index());
  stream_ = cuda().getStreamFromGlobalPool(on, /*isHighPriority=*/true);
}

c10::Stream CommStream::current() const { return cuda().getStream(stream_->device()); }

void CommStream::wait_for_current() const {
  if (active()) order(*stream_, current());
}

void CommStream::current_waits(const Work* work) const {
  if (!active()) return;
  const c10::Stream compute = current();
  // How long the compute stream stalls here: the communication it could not hide.
  const trace::DeviceSpan stall("wait", trace::category::device_wait, trace::kComputeLane, compute);
  const auto done = work ? work->completion_event() : nullptr;
  if (done) {
    done->block(compute);
  } else {
    order(compute, *stream_);
  }
}

void CommStream::used_on_current(const at::Tensor& t) const {
  if (active()) record_on(t, current());
}

void CommStream::used_here(const at::Tensor& t) const {
  if (active()) record_on(t, *stream_);
}

}  // namespace dtrain::detail
