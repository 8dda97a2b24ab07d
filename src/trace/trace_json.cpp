#include "trace/trace_json.h"

#include <algorithm>
#include <cstdio>

namespace dtrain::trace::detail {
namespace {

void append_string(std::string& out, const char* text) {
  out += '"';
  for (const char* c = text ? text : ""; *c; ++c) {
    switch (*c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(*c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(*c)));
          out += escaped;
        } else {
          out += *c;
        }
    }
  }
  out += '"';
}

// Chrome traces count in microseconds; three decimals keep the nanoseconds.
void append_microseconds(std::string& out, int64_t ns) {
  char text[32];
  std::snprintf(text, sizeof text, "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>(ns % 1000));
  out += text;
}

void append_args(std::string& out, const Event& event) {
  out += ",\"args\":{";
  for (int i = 0; i < event.arg_count; ++i) {
    if (i) out += ',';
    append_string(out, event.args[i].key);
    out += ':';
    if (event.args[i].text) append_string(out, event.args[i].text);
    else out += std::to_string(event.args[i].number);
  }
  out += '}';
}

void append_event(std::string& out, const Event& event, int pid, int tid) {
  out += "{\"ph\":\"";
  out += event.phase;
  out += "\",\"name\":";
  append_string(out, event.name);
  out += ",\"cat\":";
  append_string(out, event.category);
  out += ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) + ",\"ts\":";
  append_microseconds(out, event.start_ns);
  if (event.phase == 'X') {
    out += ",\"dur\":";
    append_microseconds(out, event.duration_ns);
  }
  if (event.phase == 'i') out += ",\"s\":\"t\"";  // an instant on its thread's track
  append_args(out, event);
  out += '}';
}

void append_metadata(std::string& out, const char* what, int pid, int tid, const char* key, const std::string& value,
                     bool quoted) {
  out += "{\"ph\":\"M\",\"name\":\"";
  out += what;
  out += "\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"" + key + "\":";
  if (quoted) append_string(out, value.c_str());
  else out += value;
  out += "}}";
}

}  // namespace

std::string events_json(const std::vector<ThreadTrace>& threads, int pid) {
  std::string out;
  auto separate = [&out] {
    if (!out.empty()) out += ",\n";
  };
  separate();
  append_metadata(out, "process_name", pid, 0, "name", "rank " + std::to_string(pid), true);
  separate();
  append_metadata(out, "process_sort_index", pid, 0, "sort_index", std::to_string(pid), false);
  for (const auto& thread : threads) {
    if (thread.events.empty()) continue;
    const std::string name = thread.name ? thread.name : "thread " + std::to_string(thread.tid);
    separate();
    append_metadata(out, "thread_name", pid, thread.tid, "name", name, true);
    separate();
    append_metadata(out, "thread_sort_index", pid, thread.tid, "sort_index", std::to_string(thread.tid), false);

    // Spans are recorded when they end (children first); viewers nest
    // best when a parent comes first: by start, longer first.
    std::vector<const Event*> ordered;
    ordered.reserve(thread.events.size());
    for (const auto& event : thread.events) ordered.push_back(&event);
    std::stable_sort(ordered.begin(), ordered.end(), [](const Event* a, const Event* b) {
      if (a->start_ns != b->start_ns) return a->start_ns < b->start_ns;
      return a->duration_ns > b->duration_ns;
    });
    for (const Event* event : ordered) {
      separate();
      append_event(out, *event, pid, thread.tid);
    }
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
