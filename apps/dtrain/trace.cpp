#include "trace.h"

#include "dtrain/trace.h"
#include "dtrain/trace_summary.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <stdexcept>

namespace dtrain::cli {

CLI::App* add_trace_subcommand(CLI::App& app, TraceFlags& flags) {
  auto* trace = app.add_subcommand("trace", "Timeline traces (Chrome trace-event JSON; open them in Perfetto)");
  trace->require_subcommand(1);
  auto* summary = trace->add_subcommand(
      "summary", "Per rank: compute, communication, exposed (non-overlapped) communication, overlap fraction");
  summary->add_option("path", flags.path, "Trace file (dtrain train --trace PATH)")->required();
  summary->add_flag("--json", flags.json, "Print JSON instead of a table");
  summary->footer(
      "compute: the training thread computing, not blocked on communication. comm: communication in flight.\n"
      "exposed: the training thread blocked in a wait while communication ran. other = wall - compute - exposed.\n"
      "overlap = 1 - exposed / comm: the share of communication hidden behind compute.\n"
      "On a GPU (--comm-streams on), a second table reads the same from spans timed on the device: compute on\n"
      "the compute stream, comm on the communication streams, exposed where the compute stream stalled for them.");
  return summary;
}

namespace {

nlohmann::ordered_json to_json(const trace::RankSummary& r) {
  return {{"rank", r.rank},
          {"wall_ms", r.wall_us / 1000},
          {"compute_ms", r.compute_us / 1000},
          {"comm_ms", r.comm_us / 1000},
          {"exposed_comm_ms", r.exposed_comm_us / 1000},
          {"other_ms", r.other_us / 1000},
          {"overlap", r.overlap},
          {"steps", r.steps},
          {"mean_step_ms", r.mean_step_us / 1000},
          {"collectives", r.collectives},
          {"collective_bytes", r.collective_bytes},
          {"waits", r.waits},
          {"device_timed", r.device_timed},
          {"device_compute_ms", r.device_compute_us / 1000},
          {"device_comm_ms", r.device_comm_us / 1000},
          {"device_exposed_comm_ms", r.device_exposed_comm_us / 1000},
          {"device_overlap", r.device_overlap}};
}

void print_table(const std::vector<trace::RankSummary>& ranks) {
  std::printf("%4s %10s %11s %9s %11s %9s %8s %6s %9s %11s\n", "rank", "wall ms", "compute ms", "comm ms",
              "exposed ms", "other ms", "overlap", "steps", "step ms", "collectives");
  for (const auto& r : ranks) {
    std::printf("%4d %10.2f %11.2f %9.2f %11.2f %9.2f %7.1f%% %6lld %9.2f %11lld\n", r.rank, r.wall_us / 1000,
                r.compute_us / 1000, r.comm_us / 1000, r.exposed_comm_us / 1000, r.other_us / 1000, 100 * r.overlap,
                static_cast<long long>(r.steps), r.mean_step_us / 1000, static_cast<long long>(r.collectives));
  }
  bool any_device = false;
  for (const auto& r : ranks) any_device = any_device || r.device_timed;
  if (!any_device) return;
  std::printf("\ntimed on the GPU (device_* spans):\n%4s %11s %9s %11s %8s\n", "rank", "compute ms", "comm ms",
              "exposed ms", "overlap");
  for (const auto& r : ranks) {
    if (!r.device_timed) continue;
    std::printf("%4d %11.2f %9.2f %11.2f %7.1f%%\n", r.rank, r.device_compute_us / 1000, r.device_comm_us / 1000,
                r.device_exposed_comm_us / 1000, 100 * r.device_overlap);
  }
}

}  // namespace

int trace_summary_main(const TraceFlags& flags) {
  std::vector<trace::RankSummary> ranks;
  try {
    ranks = trace::summarize_file(flags.path);
  } catch (const std::invalid_argument& error) {
    // Not a usage error (exit 2): the file is bad.
    throw std::runtime_error(error.what());
  }
  if (flags.json) {
    nlohmann::ordered_json out = {{"trace", flags.path}, {"ranks", nlohmann::ordered_json::array()}};
    for (const auto& r : ranks) out["ranks"].push_back(to_json(r));
    std::cout << out.dump(2) << std::endl;
  } else {
    print_table(ranks);
  }
  return 0;
}

}  // namespace dtrain::cli
