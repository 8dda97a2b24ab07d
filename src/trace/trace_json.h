// Chrome trace-event JSON for one process's recorded events. Internal.
#pragma once

#include "common/trace_recorder.h"

#include <string>
#include <vector>

namespace dtrain::trace::detail {

// The events of `threads` as JSON objects separated by ",\n" (no brackets),
// with pid = `pid`: metadata naming the process "rank PID" and each thread,
// then every thread's events ordered by start (a parent before its children).
std::string events_json(const std::vector<ThreadTrace>& threads, int pid);

// The whole file around comma-separated event lists, one per rank.
std::string trace_file_json(const std::vector<std::string>& rank_events);

}  // namespace dtrain::trace::detail
