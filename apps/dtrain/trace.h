// `dtrain trace summary PATH`: per rank, compute time, communication time,
// exposed (non-overlapped) communication and the overlap fraction of a trace
// written by dtrain::trace::write (include/dtrain/trace_summary.h does the
// arithmetic; this file is flags and printing).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace dtrain::cli {

struct TraceFlags {
  std::string path;
  bool json = false;
};

// Adds `trace` and its `summary` subcommand; returns `summary`.
CLI::App* add_trace_subcommand(CLI::App& app, TraceFlags& flags);

// After parsing. Throws std::runtime_error for a file that is not a trace.
int trace_summary_main(const TraceFlags& flags);

}  // namespace dtrain::cli
