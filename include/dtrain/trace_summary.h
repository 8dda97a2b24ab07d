// Reading a trace back: `dtrain trace summary`, per rank, where the time
// went. Offline: it parses a file dtrain::trace::write() wrote
// (dtrain/trace.h records and writes it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::trace {

// `dtrain trace summary`: per rank, where the time went.
//
// Note [trace summary]: all intervals are of one rank. T is the thread named
// "train" (else the thread with the most compute spans). C = union of T's
// "compute" spans, W = union of T's "wait" spans, M = union of the "comm"
// spans of every thread.
//   wall      = last span end - first span start (any thread)
//   compute   = |C \ W|      (T computing, not blocked on communication)
//   exposed   = |W ∩ M|      (T blocked while communication ran: not hidden)
//   other     = wall - compute - exposed   (data, logging, idle, scheduling)
//   comm      = |M|          (communication in flight, hidden or not)
//   overlap   = 1 - exposed / comm  (1 when there was no communication)
// So compute + exposed + other == wall exactly, and exposed <= comm.
struct RankSummary {
  int rank = 0;
  double wall_us = 0, compute_us = 0, comm_us = 0, exposed_comm_us = 0, other_us = 0;
  double overlap = 1;
  int64_t steps = 0;            // "step" spans on T
  double mean_step_us = 0;
  int64_t collectives = 0;      // "comm" spans
  int64_t collective_bytes = 0; // their "bytes" args, summed
  int64_t waits = 0;            // "wait" spans on T
};
// Parses a trace (the text of a file write() wrote). Throws
// std::invalid_argument naming what is wrong when it is not one.
std::vector<RankSummary> summarize(const std::string& trace_json);
// Reads and parses a trace file; the error names the path.
std::vector<RankSummary> summarize_file(const std::string& path);

}  // namespace dtrain::trace
