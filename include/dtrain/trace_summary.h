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
// On a GPU the host spans time how long kernels took to queue, not to run;
// the device-timed spans (categories device_*, Note [trace names]) say what
// the streams did. Over every track: Cd = union of "device_compute", Wd of
// "device_wait" (the compute stream stalled for a communication stream), Md
// of "device_comm":
//   device_compute = |Cd \ Wd|, device_comm = |Md|,
//   device_exposed = |Wd ∩ Md|, device_overlap = 1 - device_exposed / device_comm.
// device_timed is false (and these are 0, overlap 1) when the trace has no
// device_comm span: a CPU run, or collectives issued from the compute stream
// (--comm-streams off), whose NCCL work no dtrain event brackets.
struct RankSummary {
  int rank = 0;
  double wall_us = 0, compute_us = 0, comm_us = 0, exposed_comm_us = 0, other_us = 0;
  double overlap = 1;
  int64_t steps = 0;            // "step" spans on T
  double mean_step_us = 0;
  int64_t collectives = 0;      // "comm" spans
  int64_t collective_bytes = 0; // their "bytes" args, summed
  int64_t waits = 0;            // "wait" spans on T
  bool device_timed = false;
  double device_compute_us = 0, device_comm_us = 0, device_exposed_comm_us = 0;
  double device_overlap = 1;
};
// Parses a trace (the text of a file write() wrote). Throws
// std::invalid_argument naming what is wrong when it is not one.
std::vector<RankSummary> summarize(const std::string& trace_json);
// Reads and parses a trace file; the error names the path.
std::vector<RankSummary> summarize_file(const std::string& path);

}  // namespace dtrain::trace
