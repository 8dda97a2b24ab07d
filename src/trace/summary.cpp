// The trace summary: compute, communication and exposed communication per
// rank (see Note [trace summary] in dtrain/trace_summary.h).
#include "dtrain/trace.h"
#include "dtrain/trace_summary.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

namespace dtrain::trace {
namespace {

// Half-open [begin, end) in integer nanoseconds, so the sums are exact.
struct Interval {
  int64_t begin = 0, end = 0;
};
using Intervals = std::vector<Interval>;  // sorted, disjoint after normalized()

Intervals normalized(Intervals spans) {
  std::sort(spans.begin(), spans.end(), [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  Intervals merged;
  for (const auto& span : spans) {
    if (span.end <= span.begin) continue;
    if (!merged.empty() && span.begin <= merged.back().end) merged.back().end = std::max(merged.back().end, span.end);
    else merged.push_back(span);
  }
  return merged;
}

int64_t length(const Intervals& spans) {
  int64_t total = 0;
  for (const auto& span : spans) total += span.end - span.begin;
  return total;
}

Intervals intersection(const Intervals& a, const Intervals& b) {
  Intervals out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const int64_t begin = std::max(a[i].begin, b[j].begin);
    const int64_t end = std::min(a[i].end, b[j].end);
    if (begin < end) out.push_back({begin, end});
    if (a[i].end < b[j].end) ++i;
    else ++j;
  }
  return out;
}

// |a \ b| = |a| - |a ∩ b|.
int64_t length_without(const Intervals& a, const Intervals& b) { return length(a) - length(intersection(a, b)); }

struct Span {
  int tid = 0;
  std::string name, category;
  Interval interval;
  int64_t bytes = 0;
};

struct RankEvents {
  std::map<int, std::string> thread_names;
  std::vector<Span> spans;
};

[[noreturn]] void reject(const std::string& why) {
  throw std::invalid_argument(why + ". A trace is the Chrome trace-event JSON that dtrain::trace::write() or "
                                    "`dtrain train --trace PATH` writes");
}

int64_t to_ns(const nlohmann::json& microseconds, const char* field, size_t index) {
  if (!microseconds.is_number())
    reject("event " + std::to_string(index) + " has no numeric \"" + field + "\" (microseconds)");
  return std::llround(microseconds.get<double>() * 1000.0);
}

std::map<int, RankEvents> read_events(const nlohmann::json& trace) {
  const nlohmann::json* events = nullptr;
  if (trace.is_array()) events = &trace;  // the spec's array form
  else if (trace.is_object() && trace.contains("traceEvents") && trace["traceEvents"].is_array())
    events = &trace["traceEvents"];
  if (!events) reject("it has no \"traceEvents\" array");

  std::map<int, RankEvents> ranks;
  for (size_t i = 0; i < events->size(); ++i) {
    const auto& event = (*events)[i];
    if (!event.is_object() || !event.contains("ph") || !event["ph"].is_string())
      reject("event " + std::to_string(i) + " is not an object with a \"ph\" phase");
    if (!event.contains("pid") || !event["pid"].is_number_integer())
      reject("event " + std::to_string(i) + " has no integer \"pid\" (the rank)");
    const int pid = event["pid"].get<int>();
    const int tid = event.value("tid", 0);
    const auto phase = event["ph"].get<std::string>();
    auto& rank = ranks[pid];
    if (phase == "M" && event.value("name", "") == "thread_name" && event.contains("args")) {
      rank.thread_names[tid] = event["args"].value("name", "");
    } else if (phase == "X") {
      Span span;
      span.tid = tid;
      span.name = event.value("name", "");
      span.category = event.value("cat", "");
      span.interval.begin = to_ns(event.value("ts", nlohmann::json()), "ts", i);
      span.interval.end = span.interval.begin + to_ns(event.value("dur", nlohmann::json()), "dur", i);
      if (event.contains("args") && event["args"].is_object())
        span.bytes = event["args"].value("bytes", int64_t{0});
      rank.spans.push_back(std::move(span));
    }
  }
  return ranks;
}

// The thread named "train"; else the one with the most compute spans.
int training_thread(const RankEvents& rank) {
  for (const auto& [tid, name] : rank.thread_names)
    if (name == "train") return tid;
  std::map<int, int> compute_spans;
  for (const auto& span : rank.spans)
    if (span.category == category::compute) ++compute_spans[span.tid];
  int best = rank.spans.empty() ? 0 : rank.spans.front().tid, most = -1;
  for (const auto& [tid, count] : compute_spans) {
    if (count > most) best = tid, most = count;
  }
  return best;
}

RankSummary summarize_rank(int pid, const RankEvents& rank) {
  RankSummary summary;
  summary.rank = pid;
  const int train = training_thread(rank);
  Intervals compute, waits, comm, steps;
  Intervals device_compute, device_waits, device_comm;
  int64_t first = INT64_MAX, last = INT64_MIN;
  for (const auto& span : rank.spans) {
    first = std::min(first, span.interval.begin);
    last = std::max(last, span.interval.end);
    if (span.category == category::device_compute) device_compute.push_back(span.interval);
    if (span.category == category::device_wait) device_waits.push_back(span.interval);
    if (span.category == category::device_comm) device_comm.push_back(span.interval);
    if (span.category == category::comm) {
      comm.push_back(span.interval);
      ++summary.collectives;
      summary.collective_bytes += span.bytes;
    }
    if (span.tid != train) continue;
    if (span.category == category::compute) compute.push_back(span.interval);
    if (span.category == category::wait) {
      waits.push_back(span.interval);
      ++summary.waits;
    }
    if (span.category == category::step && span.name == "step") steps.push_back(span.interval);
  }
  if (rank.spans.empty()) return summary;
  compute = normalized(compute);
  waits = normalized(waits);
  comm = normalized(comm);

  const int64_t wall = last - first;
  const int64_t computing = length_without(compute, waits);
  const int64_t exposed = length(intersection(waits, comm));
  const int64_t communicating = length(comm);
  summary.wall_us = static_cast<double>(wall) / 1000.0;
  summary.compute_us = static_cast<double>(computing) / 1000.0;
  summary.exposed_comm_us = static_cast<double>(exposed) / 1000.0;
  summary.other_us = static_cast<double>(wall - computing - exposed) / 1000.0;
  summary.comm_us = static_cast<double>(communicating) / 1000.0;
  summary.overlap = communicating > 0 ? 1.0 - static_cast<double>(exposed) / static_cast<double>(communicating) : 1.0;
  summary.steps = static_cast<int64_t>(steps.size());
  int64_t step_total = 0;
  for (const auto& step : steps) step_total += step.end - step.begin;
  if (!steps.empty()) summary.mean_step_us = static_cast<double>(step_total) / 1000.0 / static_cast<double>(steps.size());

  device_comm = normalized(device_comm);
  if (!device_comm.empty()) {
    device_compute = normalized(device_compute);
    device_waits = normalized(device_waits);
    const int64_t device_communicating = length(device_comm);
    const int64_t device_exposed = length(intersection(device_waits, device_comm));
    summary.device_timed = true;
    summary.device_compute_us = static_cast<double>(length_without(device_compute, device_waits)) / 1000.0;
    summary.device_comm_us = static_cast<double>(device_communicating) / 1000.0;
    summary.device_exposed_comm_us = static_cast<double>(device_exposed) / 1000.0;
    summary.device_overlap = 1.0 - static_cast<double>(device_exposed) / static_cast<double>(device_communicating);
  }
  return summary;
}

}  // namespace

std::vector<RankSummary> summarize(const std::string& trace_json) {
  nlohmann::json trace;
  try {
    trace = nlohmann::json::parse(trace_json);
  } catch (const nlohmann::json::parse_error& error) {
    reject(std::string("it is not valid JSON (") + error.what() + ")");
  }
  std::vector<RankSummary> summaries;
  try {
    for (const auto& [pid, events] : read_events(trace)) summaries.push_back(summarize_rank(pid, events));
  } catch (const nlohmann::json::exception& error) {
    reject(std::string("an event has a field of the wrong type (") + error.what() + ")");
  }
  bool any_span = false;
  for (const auto& summary : summaries) any_span = any_span || summary.wall_us > 0;
  if (!any_span) reject("it holds no spans (\"ph\": \"X\" events)");
  return summaries;
}

std::vector<RankSummary> summarize_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("cannot open trace file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return summarize(text.str());
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument("'" + path + "' is not a dtrain trace: " + error.what());
  }
}

}  // namespace dtrain::trace
