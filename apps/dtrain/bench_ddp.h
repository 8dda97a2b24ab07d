// `dtrain bench ddp`: step time of dtrain's DistributedDataParallel next to
// training with no communication (ideal) and to a blocking all-reduce of
// every gradient after backward (naive), on a communication-bound MLP and a
// compute-bound GPT, measured side by side in one run.
// bench/peers/ddp_peer.py measures PyTorch's own DDP the same way;
// bench/ddp.sh runs both and prints them together.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace dtrain::cli {

struct BenchDDPOptions {
  int nproc = 2;
  std::string backend = "mpi";
  std::string model = "all";  // mlp | gpt | all
  // Timed steps per mode per round; 0 = the model's default (kept small so
  // that bench/ddp.sh, C++ and Python, ends within minutes on 2 cores).
  int steps = 0;
  int rounds = 5;
  int warmup = 2;  // untimed steps per mode before the first round
  std::string json_path;
  std::string hosts;  // --hosts: across hosts (relaunch.h); empty = this machine
};

// Runs inside a launched job: every rank calls it.
int bench_ddp_rank(const BenchDDPOptions& options);

// Declares `dtrain bench ddp` and its flags under `bench`.
CLI::App* add_bench_ddp_subcommand(CLI::App& bench, BenchDDPOptions& options);

}  // namespace dtrain::cli
