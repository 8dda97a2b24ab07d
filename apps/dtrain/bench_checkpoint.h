// `dtrain bench checkpoint`: how fast sharded checkpoints are written and
// read (MB/s per rank, fsync included), and how long loading takes at
// another world size (resharding), for an FSDP-sharded GPT with AdamW state.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace dtrain::cli {

struct BenchCheckpointOptions {
  int nproc = 2;
  std::string backend = "mpi";
  int64_t layers = 8;   // GPT blocks of width `dim`: about 12 * layers * dim^2 parameters
  int64_t dim = 768;
  int rounds = 3;
  std::string dir = "bench/results/checkpoint-bench";  // removed at the end
  std::string json_path;
};

// Runs inside a launched job: every rank calls it.
int bench_checkpoint_rank(const BenchCheckpointOptions& options);

// Declares `dtrain bench checkpoint` and its flags under `bench`.
CLI::App* add_bench_checkpoint_subcommand(CLI::App& bench, BenchCheckpointOptions& options);

}  // namespace dtrain::cli
