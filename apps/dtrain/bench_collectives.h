// `dtrain bench collectives`: bus bandwidth of dtrain's all_reduce, all_gather
// and reduce_scatter next to the same operation called directly on the
// backend library, measured side by side in one run.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace dtrain::cli {

struct BenchCollectivesOptions {
  int nproc = 2;
  std::string backend = "mpi";
  std::string json_path;
  std::string hosts;  // --hosts: across hosts (relaunch.h); empty = this machine
  // Intra-op threads per rank; 0 = the launcher's default (cores / ranks per host).
  int threads_per_rank = 0;
  int64_t min_bytes = 4 << 10;
  int64_t max_bytes = int64_t{256} << 20;
};

// Runs inside a launched job: every rank calls it.
int bench_collectives_rank(const BenchCollectivesOptions& options);

// Declares `dtrain bench collectives` and its flags under `bench`.
CLI::App* add_bench_collectives_subcommand(CLI::App& bench, BenchCollectivesOptions& options);

}  // namespace dtrain::cli
