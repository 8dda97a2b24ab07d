// `dtrain launch`: starts the ranks of one job (locally, or across hosts via
// mpirun) and supervises them: a rank that dies takes the job down with a
// message saying which rank and how, and the job's exit code is the first
// failing rank's.
#pragma once

#include <string>
#include <vector>

namespace dtrain::cli {

struct LaunchOptions {
  int nproc = 0;  // required: launch() rejects 0
  std::string backend = "mpi";  // mpi | c10d
  // "host:slots,host:slots" for multi-host mpi jobs; empty = this machine.
  std::string hosts;
  // Intra-op threads per rank; 0 = cores / ranks on this machine (at least 1).
  int threads_per_rank = 0;
  // Seconds between telling the surviving ranks to stop (SIGTERM) and
  // killing them (SIGKILL) after one rank failed.
  int grace_seconds = 10;
  std::vector<std::string> command;
};

// Runs the job to completion; returns the exit code for the launcher.
int launch(const LaunchOptions& options);

// Threads per rank such that ranks x threads <= cores.
int default_threads_per_rank(int local_ranks);

// Runs one rank of an mpirun job and reports, naming the rank and host, if it
// dies; exits with the rank's code (128 + signal for a signal). Internal:
// `dtrain launch --supervise-rank -- PROGRAM ARGS`, placed by launch().
int supervise_rank(const std::vector<std::string>& command);

// The path of the running dtrain binary.
std::string self_executable();

}  // namespace dtrain::cli
