// The in-memory side of tracing (include/dtrain/trace.h): one event buffer
// per thread, so recording threads never contend with each other, and a
// registry that the writer walks. Internal.
#pragma once

#include "dtrain/trace.h"

#include <cstdint>
#include <functional>
#include <vector>

namespace dtrain::trace::detail {

struct Event {
  const char* name = nullptr;
  const char* category = nullptr;
  char phase = 'X';  // Chrome phases: X span, i instant, C counter
  int64_t start_ns = 0;
  int64_t duration_ns = 0;
  int arg_count = 0;
  Arg args[kMaxArgs];
};

// What one thread recorded since start().
struct ThreadTrace {
  int tid = 0;
  const char* name = nullptr;  // null: unnamed
  std::vector<Event> events;
  uint64_t dropped = 0;        // events beyond kMaxEventsPerThread
};

// Events kept per thread; later ones are counted and dropped, so a long run
// with tracing left on cannot exhaust memory (about 150 bytes per event).
inline constexpr size_t kMaxEventsPerThread = size_t{1} << 20;

void record(const Event& event);
// Records `event` on the track named `lane` instead of the calling thread's
// (a CUDA stream's, src/common/device_spans.h); one track per lane name,
// made on first use. `lane` must outlive the trace.
void record_on_lane(const char* lane, const Event& event);
// A copy of every thread's events so far.
std::vector<ThreadTrace> snapshot();
// The rank given to start().
int traced_rank();

}  // namespace dtrain::trace::detail
