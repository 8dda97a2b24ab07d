// `dtrain launch`: starts the ranks of one job (locally, or across hosts via
// mpirun) and supervises them: a rank that dies takes the job down with a
// message saying which rank and how, and the job's exit code is the first
// failing rank's.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace dtrain::cli {

struct LaunchOptions {
  int nproc = 0;  // required: launch() rejects 0
  // Elastic (apps/dtrain/elastic.h): each attempt runs on the hosts that
  // answer, with at least min_nproc and at most nproc ranks; 0 = always nproc.
  int min_nproc = 0;
  std::string backend = "mpi";  // mpi | c10d
  // "host:slots,host:slots" for multi-host mpi jobs; empty = this machine.
  std::string hosts;
  // Intra-op threads per rank; 0 = cores / ranks on this machine (at least 1).
  int threads_per_rank = 0;
  // Seconds between telling the surviving ranks to stop (SIGTERM) and
  // killing them (SIGKILL) after one rank failed.
  int grace_seconds = 10;
  // Restart the job this many times after a failure (apps/dtrain/restarts.h);
  // needs checkpoint_dir, the job's checkpoint folder.
  int max_restarts = 0;
  std::string checkpoint_dir;
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

// What `dtrain launch` parses: the job, and the internal --supervise-rank.
struct LaunchFlags {
  LaunchOptions options;
  std::string nproc;  // -n N or MIN:MAX, parsed into options by launch_main
  bool supervise_rank = false;
  std::vector<std::string> program_after_dashes;  // split_off_launch_program
};

// Declares `dtrain launch` and its flags.
CLI::App* add_launch_subcommand(CLI::App& app, LaunchFlags& flags);

// Before parsing: for `dtrain launch ... -- PROGRAM [ARGS...]`, moves PROGRAM
// ARGS into flags.program_after_dashes and shortens argc to end before "--",
// so the program's flags never reach CLI11. Does nothing for other commands.
void split_off_launch_program(int& argc, char** argv, LaunchFlags& flags);

// After parsing: launches the job (or, with --supervise-rank, runs one rank
// of an mpirun job). Throws std::invalid_argument for a program given both
// before and after "--" (main turns it into exit code 2).
int launch_main(LaunchFlags& flags);

}  // namespace dtrain::cli
