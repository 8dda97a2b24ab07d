// What a CUDA stream did, on the trace's timeline: spans timed by events on
// the device rather than by the host thread that queued the work.
//
// Note [device spans]
// Host spans of GPU work measure how long the host took to queue kernels,
// not when they ran, so overlap between a communication stream and the
// compute stream cannot be read from them. A DeviceSpan queues a timing event
// on its stream where it begins and another where it ends; once both have run,
// flush_device_spans() turns the pair into a span on the track named by the
// span's lane ("cuda compute", "cuda all-gather", ...), in the host's
// CLOCK_MONOTONIC time like every other event. The conversion uses one anchor
// event per device, queued and waited for when the first span on the device
// begins: its device time is taken to be the host time right after the wait
// (off by the wait's wake-up latency, microseconds). A span's start is its
// offset from the anchor and its duration is measured between its own two
// events, so durations keep the events' resolution (about 0.5 us) however long
// the run; the start's error grows with the float milliseconds CUDA reports
// (about 40 us after ten minutes).
// Who records them: the trainer (forward, backward, optimizer step on the
// compute stream), the Communicator (each CUDA collective issued in a
// DeviceLane, which a CommStream's scope sets) and CommStream::current_waits
// (the compute stream's stalls).
// Off the GPU, or with tracing off, a DeviceSpan is inactive and costs one
// check. Only the device type's own events are used (c10::Event), so this file
// builds without the CUDA toolkit; it is only active where LibTorch has CUDA.
#pragma once

#include <dtrain/trace.h>

#include <c10/core/Stream.h>

#include <initializer_list>
#include <memory>

namespace dtrain::trace {

// The compute stream's track: the trainer's forward, backward and optimizer
// step, and the stalls CommStream::current_waits records.
inline constexpr const char* kComputeLane = "cuda compute";

class DeviceSpan {
 public:
  DeviceSpan();
  // Begins a span on `stream` (queues its begin event there) when tracing is
  // on and the stream is a CUDA stream; otherwise the span is inactive.
  // `name`, `category` and `lane` must outlive the trace (literals, intern()).
  DeviceSpan(const char* name, const char* category, const char* lane, const c10::Stream& stream,
             std::initializer_list<Arg> args = {});
  DeviceSpan(DeviceSpan&&) noexcept;
  DeviceSpan& operator=(DeviceSpan&&) noexcept;
  DeviceSpan(const DeviceSpan&) = delete;
  DeviceSpan& operator=(const DeviceSpan&) = delete;
  // Ends the span (if end() was not called) on the stream it began on.
  ~DeviceSpan();

  bool active() const { return static_cast<bool>(pending_); }
  // Adds an argument (ignored when inactive or when kMaxArgs are set).
  void add(const Arg& arg);
  // Queues the end event on the stream the span began on; later calls do nothing.
  void end();

  struct Pending;

 private:
  std::unique_ptr<Pending> pending_;
};

// The track on which the communicator times the CUDA collectives this thread
// issues (Communicator's IssuerContext); null: they are not timed. Set by a
// CommStream's scope (src/comm/comm_stream.h), so a collective is timed
// where it runs on a stream of its own, and not where it would share the
// compute stream's track with the compute it stalls. Nestable.
class DeviceLane {
 public:
  explicit DeviceLane(const char* lane);
  ~DeviceLane();
  DeviceLane(const DeviceLane&) = delete;
  DeviceLane& operator=(const DeviceLane&) = delete;

 private:
  const char* previous_;
};
const char* current_device_lane();

// The current stream of `device` when it is a CUDA device, for DeviceSpan.
// (Any other device: its type's default, which makes an inactive span.)
c10::Stream current_stream_of(const c10::Device& device);

// Turns every ended span whose events have run into a trace event; with
// `wait`, first waits for all of them (trace::write does, before gathering).
void flush_device_spans(bool wait);

}  // namespace dtrain::trace
