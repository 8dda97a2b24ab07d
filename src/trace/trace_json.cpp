#include "trace/trace_json.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace dtrain::trace::detail {
namespace {

using Json = nlohmann::ordered_json;

// Names come from modules and callers: any bytes. The JSON library escapes
// them and replaces invalid UTF-8 with U+FFFD, so the file always parses.
std::string dump(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string text_of(const char* text) { return text ? text : ""; }

// Chrome traces count in microseconds; a double keeps the nanoseconds.
double microseconds(int64_t ns) { return static_cast<double>(ns) / 1000.0; }

Json event_json(const Event& event, int pid, int tid) {
  Json json{{"ph", std::string(1, event.phase)},
            {"name", text_of(event.name)},
            {"cat", text_of(event.category)},
            {"pid", pid},
            {"tid", tid},
            {"ts", microseconds(event.start_ns)}};
  if (event.phase == 'X') json["dur"] = microseconds(event.duration_ns);
  if (event.phase == 'i') json["s"] = "t";  // an instant on its thread's track
  Json args = Json::object();
  for (int i = 0; i < event.arg_count; ++i) {
    const auto& arg = event.args[i];
    if (arg.text) args[text_of(arg.key)] = arg.text;
    else args[text_of(arg.key)] = arg.number;
  }
  json["args"] = std::move(args);
  return json;
}

Json metadata_json(const char* what, int pid, int tid, const char* key, Json value) {
  return Json{{"ph", "M"}, {"name", what}, {"pid", pid}, {"tid", tid}, {"args", Json{{key, std::move(value)}}}};
}

}  // namespace

std::string events_json(const std::vector<ThreadTrace>& threads, int pid) {
  std::string out;
  auto append = [&out](const Json& json) {
    if (!out.empty()) out += ",\n";
    out += dump(json);
  };
  append(metadata_json("process_name", pid, 0, "name", "rank " + std::to_string(pid)));
  append(metadata_json("process_sort_index", pid, 0, "sort_index", pid));
  for (const auto& thread : threads) {
    if (thread.events.empty()) continue;
    const std::string name = thread.name ? thread.name : "thread " + std::to_string(thread.tid);
    append(metadata_json("thread_name", pid, thread.tid, "name", name));
    append(metadata_json("thread_sort_index", pid, thread.tid, "sort_index", thread.tid));

    // Spans are recorded when they end (children first); viewers nest
    // best when a parent comes first: by start, longer first.
    std::vector<const Event*> ordered;
    ordered.reserve(thread.events.size());
    for (const auto& event : thread.events) ordered.push_back(&event);
    std::stable_sort(ordered.begin(), ordered.end(), [](const Event* a, const Event* b) {
      if (a->start_ns != b->start_ns) return a->start_ns < b->start_ns;
      return a->duration_ns > b->duration_ns;
    });
    for (const Event* event : ordered) append(event_json(*event, pid, thread.tid));
  }
  return out;
}

std::string trace_file_json(const std::vector<std::string>& rank_events) {
  std::string out = "{\"traceEvents\":[\n";
  bool first = true;
  for (const auto& events : rank_events) {
    if (events.empty()) continue;
    if (!first) out += ",\n";
    out += events;
    first = false;
  }
  out += "\n],\"displayTimeUnit\":\"ms\"}\n";
  return out;
}

}  // namespace dtrain::trace::detail
