// Device-timed spans (src/common/device_spans.h, Note [device spans]).
#include "common/device_spans.h"

#include "common/trace_recorder.h"

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cmath>
#include <map>
#include <mutex>
#include <vector>

namespace dtrain::trace {

struct DeviceSpan::Pending {
  detail::Event event;  // name, category and args; times filled in on flush
  const char* lane = nullptr;
  c10::Stream stream;
  c10::Event begin{c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT};  // BACKEND_DEFAULT: timed
  c10::Event end{c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT};

  explicit Pending(const c10::Stream& on) : stream(on) {}
};

namespace {

struct Anchor {
  c10::Event event{c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT};
  int64_t host_ns = 0;
};

struct Registry {
  std::mutex mutex;
  std::map<c10::DeviceIndex, std::unique_ptr<Anchor>> anchors;
  std::vector<std::unique_ptr<DeviceSpan::Pending>> ended;
};

Registry& registry() {
  static auto* instance = new Registry;  // never destroyed: spans may end during static destruction
  return *instance;
}

// Ended spans kept before the completed ones are converted (each holds two events).
constexpr size_t kFlushEvery = 4096;

const Anchor& anchor_for(Registry& reg, const c10::Stream& stream) {
  auto& anchor = reg.anchors[stream.device_index()];
  if (!anchor) {
    auto made = std::make_unique<Anchor>();
    made->event.record(stream);
    made->event.synchronize();
    made->host_ns = now_ns();
    anchor = std::move(made);
  }
  return *anchor;
}

void convert(Registry& reg, DeviceSpan::Pending& span) {
  const Anchor& anchor = *reg.anchors.at(span.stream.device_index());
  const double start_ms = anchor.event.elapsedTime(span.begin);
  const double duration_ms = span.begin.elapsedTime(span.end);
  span.event.start_ns = anchor.host_ns + static_cast<int64_t>(std::llround(start_ms * 1e6));
  span.event.duration_ns = std::max<int64_t>(0, static_cast<int64_t>(std::llround(duration_ms * 1e6)));
  try {
    detail::record_on_lane(span.lane, span.event);
  } catch (...) {
    // Out of memory while tracing: lose the event, never the run.
  }
}

// Converts the ended spans whose end event has run (all of them, after
// waiting, with `wait`); keeps the rest. Called with reg.mutex held.
void flush_locked(Registry& reg, bool wait) {
  std::vector<std::unique_ptr<DeviceSpan::Pending>> still_running;
  for (auto& span : reg.ended) {
    if (wait) span->end.synchronize();
    if (wait || span->end.query()) {
      convert(reg, *span);
    } else {
      still_running.push_back(std::move(span));
    }
  }
  reg.ended = std::move(still_running);
}

}  // namespace

DeviceSpan::DeviceSpan(const char* name, const char* category, const char* lane, const c10::Stream& stream,
                       std::initializer_list<Arg> args) {
  if (!enabled() || stream.device_type() != c10::DeviceType::CUDA) return;
  auto pending = std::make_unique<Pending>(stream);
  pending->event.name = name;
  pending->event.category = category;
  pending->event.phase = 'X';
  for (const auto& arg : args) {
    if (pending->event.arg_count == kMaxArgs) break;
    pending->event.args[pending->event.arg_count++] = arg;
  }
  pending->lane = lane;
  {
    auto& reg = registry();
    std::lock_guard lock(reg.mutex);
    anchor_for(reg, stream);  // before the begin event, so the anchor precedes it on the stream
  }
  pending->begin.record(stream);
  pending_ = std::move(pending);
}

DeviceSpan::DeviceSpan() = default;
DeviceSpan::DeviceSpan(DeviceSpan&&) noexcept = default;
DeviceSpan& DeviceSpan::operator=(DeviceSpan&& other) noexcept {
  if (this != &other) {
    try {
      end();
    } catch (...) {
      // A device error while tracing: lose the span; the run reports the error itself.
    }
    pending_ = std::move(other.pending_);
  }
  return *this;
}

void DeviceSpan::add(const Arg& arg) {
  if (pending_ && pending_->event.arg_count < kMaxArgs) pending_->event.args[pending_->event.arg_count++] = arg;
}

namespace {
thread_local const char* t_device_lane = nullptr;
}  // namespace

DeviceLane::DeviceLane(const char* lane) : previous_(t_device_lane) { t_device_lane = lane; }
DeviceLane::~DeviceLane() { t_device_lane = previous_; }
const char* current_device_lane() { return t_device_lane; }

DeviceSpan::~DeviceSpan() {
  try {
    end();
  } catch (...) {
    // A device error while tracing: lose the span; the run reports the error itself.
  }
}

void DeviceSpan::end() {
  if (!pending_) return;
  pending_->end.record(pending_->stream);
  auto& reg = registry();
  std::lock_guard lock(reg.mutex);
  reg.ended.push_back(std::move(pending_));
  if (reg.ended.size() >= kFlushEvery) flush_locked(reg, /*wait=*/false);
}

c10::Stream current_stream_of(const c10::Device& device) {
  if (!device.is_cuda()) return c10::Stream(c10::Stream::DEFAULT, device);
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

void flush_device_spans(bool wait) {
  auto& reg = registry();
  std::lock_guard lock(reg.mutex);
  flush_locked(reg, wait);
}

}  // namespace dtrain::trace
