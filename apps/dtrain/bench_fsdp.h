// `dtrain bench fsdp`: what sharding buys and costs.
//
// - memory: a ~100M-parameter GPT under DDP, ZeRO-1, ZeRO-2 and full
//   sharding at several world sizes; each rank's peak tensor bytes from the
//   tracking allocator (include/dtrain/memory.h) over steady-state steps,
//   next to `dtrain plan`'s prediction for that rank (include/dtrain/plan.h).
// - speed: full sharding (with and without prefetch) against DDP at world
//   size 2 on the ~20M GPT of `dtrain bench ddp`, alternating rounds, medians.
// bench/peers/fsdp_peer.py measures PyTorch's FSDP2 on the speed workload;
// bench/fsdp.sh runs both and prints the ratio.
//
// The command launches its own jobs (one per world size, then the speed
// job), like `dtrain bench ddp`, with ranks x threads <= cores.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace dtrain::cli {

struct BenchFSDPOptions {
  std::vector<std::string> parts{"memory", "speed"};
  std::vector<int> world_sizes{1, 2, 4, 8};
  std::vector<std::string> strategies{"ddp", "zero1", "zero2", "fsdp"};
  std::string backend = "mpi";
  int memory_steps = 3;  // the first builds the optimizer state; the peak is taken over the rest
  // A (world size, strategy) run is skipped when the plan says its ranks
  // together would hold more than this (plus a runtime allowance per rank).
  double max_job_gib = 10.0;
  int speed_steps = 3;   // timed steps per mode per round
  int rounds = 7;
  int warmup = 1;
  std::string json_path;
  std::string hosts;  // --hosts: the speed job across hosts (relaunch.h); empty = this machine

  // Internal: set on the command line of the launched jobs.
  std::string job;       // memory | speed
  std::string job_json;  // where rank 0 of the job writes its results
};

// Outside a job: launches the jobs and merges their results. `words` is the
// command line after the program name; each job gets it (relaunch_as_job)
// with --job and --job-json added.
int bench_fsdp(const BenchFSDPOptions& options, const std::vector<std::string>& words);
// Inside a launched job: every rank calls it.
int bench_fsdp_rank(const BenchFSDPOptions& options);

// Declares `dtrain bench fsdp` and its flags under `bench`.
CLI::App* add_bench_fsdp_subcommand(CLI::App& bench, BenchFSDPOptions& options);

}  // namespace dtrain::cli
