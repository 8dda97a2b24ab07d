// A CUDA stream of its own for a kind of collective (FSDP's all-gathers, its
// reduce-scatters, DDP's bucket all-reduces), ordered against the compute
// stream by events.
//
// Note [communication streams]
// The Communicator runs each operation on its own thread, with the stream
// that was current where the operation was issued made current there
// (IssuerContext in src/comm/communicator.cpp): NCCL waits for that stream's
// work before it starts, and the stream waits for NCCL's result when the
// communicator thread has issued it; Gloo copies CUDA tensors through host
// memory on that stream. Issued from the compute stream, an all-gather
// prefetched for the next FSDP unit would therefore wait for every kernel
// queued before the communicator thread reaches it, and the compute stream
// would then wait for the gather before running the current unit's later
// kernels: no overlap. Issued from a CommStream instead:
// - wait_for_current(): before issuing, the communication stream waits (an
//   event, not a device-wide sync) for what the compute stream has queued so
//   far: the inputs' last writes (an optimizer step, a gradient);
// - Scope: the operation is issued, and the copies into and out of its
//   buffers are queued, with the communication stream current;
// - current_waits(work): where the result is consumed, after the
//   operation's Work::wait() (so that the communicator thread has queued it),
//   the compute stream waits for that operation's completion event
//   (Work::completion_event), not for the stream's end: by then the stream
//   may already hold the next unit's prefetched gather, which the compute
//   stream must not wait for. Work the issuer queues on the stream after the
//   operation (decoding a compressed gather) is done on the compute stream
//   instead, after this wait. current_waits() without an operation waits for
//   all the stream has queued (DDP, once every bucket is in).
// Memory: the caching allocator reuses a freed block at once for the stream
// it was allocated on. A tensor allocated on one of the two streams and used
// on the other is recorded on that other stream (record_stream) before it is
// freed, so its block waits for the other stream's work. Buffers allocated on
// the compute stream and written by the communication stream (FSDP's full
// parameters) need no record: the communication stream waited for the
// compute stream before writing, and the compute stream waits for it before
// it uses, and then frees, them.
// Collectives issued in a CommStream's scope are timed on the device, on the
// track named by the stream's lane (Note [device spans]).
// A CommStream is active only for a CUDA device and when asked for
// (FSDPOptions/DDPOptions::comm_streams); inactive, every call does nothing
// and collectives are issued from whatever stream is current, as before.
#pragma once

#include "common/device_spans.h"

#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include <optional>

namespace at {
class Tensor;
}

namespace dtrain {
class Work;
}

namespace dtrain::detail {

class CommStream {
 public:
  CommStream() = default;  // inactive
  // A stream from the device's pool when `device` is a CUDA device and
  // `enabled`; inactive otherwise. `lane`: the trace track of its
  // collectives (a literal, "cuda all-gather").
  CommStream(const std::optional<c10::Device>& device, bool enabled, const char* lane);

  bool active() const { return stream_.has_value(); }
  const c10::Stream& stream() const { return *stream_; }
  // The device's current stream on this thread (the compute stream).
  c10::Stream current() const;

  // This stream waits for what the current stream has queued so far.
  void wait_for_current() const;
  // The current stream waits for `work` (issued in this stream's scope) to
  // have finished; without it (or for host tensors), for all this stream has
  // queued so far.
  void current_waits(const Work* work = nullptr) const;
  // `t` (allocated on this stream) is also used on the current stream.
  void used_on_current(const at::Tensor& t) const;
  // `t` (allocated on the current stream) is also used on this stream.
  void used_here(const at::Tensor& t) const;

  // Makes the stream current on this thread for the scope's lifetime (does
  // nothing when the CommStream is inactive).
  class Scope {
   public:
    explicit Scope(const CommStream& stream) {
      if (!stream.active()) return;
      guard_.emplace(stream.stream());
      lane_.emplace(stream.lane_);
    }

   private:
    std::optional<c10::StreamGuard> guard_;
    std::optional<trace::DeviceLane> lane_;
  };

 private:
  std::optional<c10::Stream> stream_;
  const char* lane_ = nullptr;
};

}  // namespace dtrain::detail
