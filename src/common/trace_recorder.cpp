// Recording: per-thread buffers, spans, labels (include/dtrain/trace.h).
#include "common/trace_recorder.h"

#include "dtrain/memory.h"

#include <time.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <mutex>
#include <unordered_set>

namespace dtrain::trace {
namespace detail {

std::atomic<bool> g_recording{false};

namespace {

struct ThreadBuffer {
  std::mutex mutex;  // uncontended except while a writer copies the events
  int tid = 0;
  const char* name = nullptr;
  std::deque<Event> events;  // a deque never copies old events when it grows
  uint64_t dropped = 0;
};

struct Registry {
  std::mutex mutex;
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;  // also of threads that ended
  std::map<std::string, ThreadBuffer*> lanes;          // tracks that are not threads, by name
  int next_tid = 1;
  int rank = 0;
};

// Never destroyed: communicator threads may still record during static destruction.
Registry& registry() {
  static Registry* instance = new Registry;
  return *instance;
}

thread_local ThreadBuffer* t_buffer = nullptr;
thread_local const char* t_thread_name = nullptr;
thread_local LabelValue t_label;

ThreadBuffer& this_thread_buffer() {
  if (!t_buffer) {
    auto buffer = std::make_unique<ThreadBuffer>();
    buffer->name = t_thread_name;
    auto& reg = registry();
    std::lock_guard lock(reg.mutex);
    buffer->tid = reg.next_tid++;
    t_buffer = buffer.get();
    reg.buffers.push_back(std::move(buffer));
  }
  return *t_buffer;
}

}  // namespace

namespace {

void append(ThreadBuffer& buffer, const Event& event) {
  std::lock_guard lock(buffer.mutex);
  if (buffer.events.size() >= kMaxEventsPerThread) {
    ++buffer.dropped;
    return;
  }
  buffer.events.push_back(event);
}

ThreadBuffer& lane_buffer(const char* lane) {
  auto& reg = registry();
  std::lock_guard lock(reg.mutex);
  auto& buffer = reg.lanes[lane];
  if (!buffer) {
    auto made = std::make_unique<ThreadBuffer>();
    made->name = lane;
    made->tid = reg.next_tid++;
    buffer = made.get();
    reg.buffers.push_back(std::move(made));
  }
  return *buffer;
}

}  // namespace

void record(const Event& event) { append(this_thread_buffer(), event); }

void record_on_lane(const char* lane, const Event& event) { append(lane_buffer(lane), event); }

std::vector<ThreadTrace> snapshot() {
  auto& reg = registry();
  std::lock_guard lock(reg.mutex);
  std::vector<ThreadTrace> threads;
  for (auto& buffer : reg.buffers) {
    std::lock_guard buffer_lock(buffer->mutex);
    threads.push_back(ThreadTrace{buffer->tid, buffer->name,
                                  std::vector<Event>(buffer->events.begin(), buffer->events.end()), buffer->dropped});
  }
  return threads;
}

int traced_rank() {
  auto& reg = registry();
  std::lock_guard lock(reg.mutex);
  return reg.rank;
}

}  // namespace detail

using detail::Event;

void start(int rank) {
  if (!detail::t_thread_name) set_thread_name("train");
  auto& reg = detail::registry();
  {
    std::lock_guard lock(reg.mutex);
    reg.rank = rank;
    for (auto& buffer : reg.buffers) {
      std::lock_guard buffer_lock(buffer->mutex);
      buffer->events.clear();
      buffer->dropped = 0;
    }
  }
  detail::g_recording.store(true, std::memory_order_release);
}

void stop() { detail::g_recording.store(false, std::memory_order_release); }

void set_thread_name(const char* name) {
  detail::t_thread_name = name;
  if (detail::t_buffer) {
    std::lock_guard lock(detail::t_buffer->mutex);
    detail::t_buffer->name = name;
  }
}

const char* intern(const std::string& text) {
  static std::mutex mutex;
  static auto* strings = new std::unordered_set<std::string>;  // node-based: c_str() stays put
  std::lock_guard lock(mutex);
  return strings->insert(text).first->c_str();
}

int64_t now_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec;
}

namespace {

Event make_event(char phase, const char* name, const char* category, int64_t start_ns, int64_t duration_ns,
                 std::initializer_list<Arg> args) {
  Event event;
  event.phase = phase;
  event.name = name;
  event.category = category;
  event.start_ns = start_ns;
  event.duration_ns = duration_ns;
  for (const auto& arg : args) {
    if (event.arg_count == kMaxArgs) break;
    event.args[event.arg_count++] = arg;
  }
  return event;
}

}  // namespace

void Span::begin(const char* name, const char* category, std::initializer_list<Arg> args) {
  name_ = name;
  category_ = category;
  for (const auto& arg : args) add(arg);
  start_ns_ = now_ns();  // last, so that the set-up is not inside the span
}

void Span::end() {
  const int64_t end_ns = now_ns();
  Event event = make_event('X', name_, category_, start_ns_, end_ns - start_ns_, {});
  event.arg_count = arg_count_;
  for (int i = 0; i < arg_count_; ++i) event.args[i] = args_[i];
  try {
    detail::record(event);
  } catch (...) {
    // Out of memory while tracing: lose the event, never the run.
  }
}

void complete(const char* name, const char* category, int64_t start_ns, std::initializer_list<Arg> args) {
  if (!enabled() || start_ns < 0) return;
  const int64_t end_ns = now_ns();
  detail::record(make_event('X', name, category, start_ns, end_ns - start_ns, args));
}

void instant(const char* name, const char* category, std::initializer_list<Arg> args) {
  if (!enabled()) return;
  detail::record(make_event('i', name, category, now_ns(), 0, args));
}

void counter(const char* name, int64_t value) {
  if (!enabled()) return;
  detail::record(make_event('C', name, "memory", now_ns(), 0, {{"value", value}}));
}

void sample_memory() {
  if (!enabled() || !memory::tracking_allocator_installed()) return;
  counter("live_bytes", memory::live_bytes());
}

Label::Label(const char* key, int64_t number, const char* name) : previous_(detail::t_label) {
  detail::t_label = LabelValue{key, number, name};
}

Label::~Label() { detail::t_label = previous_; }

LabelValue current_label() { return detail::t_label; }

void add_label(Span& span, const LabelValue& label) {
  if (label.key) span.add({label.key, label.number});
  if (label.name) span.add({"name", label.name});
}

}  // namespace dtrain::trace
