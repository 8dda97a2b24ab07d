#include "bench_checkpoint.h"

#include "dtrain/checkpoint.h"
#include "dtrain/comm.h"
#include "dtrain/fsdp.h"
#include "dtrain/models.h"
#include "common/file_tree.h"
#include "common/timing.h"

#include <CLI/CLI.hpp>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <vector>

#include <unistd.h>

namespace dtrain::cli {
namespace {

using Clock = std::chrono::steady_clock;

// Collective: seconds `work` takes on the slowest rank (barriers on both
// sides, so every rank times the same interval).
double timed(Communicator& world, const std::function<void()>& work) {
  world.blocking().barrier();
  const auto start = Clock::now();
  work();
  world.blocking().barrier();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Reading right after writing would measure the page cache, not the disk.
// Dropping it needs root; the report says whether it was dropped.
bool drop_page_cache() {
  ::sync();
  std::ofstream control("/proc/sys/vm/drop_caches");
  if (!control) return false;
  control << "3\n";
  return static_cast<bool>(control.flush());
}

models::GPTConfig gpt_config(const BenchCheckpointOptions& options) {
  models::GPTConfig config;
  config.n_layer = options.layers;
  config.n_embd = options.dim;
  config.n_head = 8;
  config.seq_len = 128;
  return config;
}

// An FSDP-sharded GPT whose AdamW state exists (one step on made-up
// gradients: the values do not matter for I/O).
struct ShardedModel {
  models::GPT gpt;
  FullyShardedBase fsdp;
  torch::optim::AdamW optimizer;
  ShardedModel(const models::GPTConfig& config, CommPtr comm)
      : gpt(config), fsdp(gpt.ptr(), std::move(comm), FSDPOptions{}), optimizer(fsdp.parameters(), torch::optim::AdamWOptions(1e-4)) {
    for (auto& p : fsdp.parameters()) p.mutable_grad() = torch::full_like(p, 1e-3);
    optimizer.step();
  }
};

int64_t checkpoint_bytes(const std::string& dir) {
  int64_t bytes = 0;
  for (const auto& file : read_checkpoint_manifest(dir).files) bytes += file.bytes;
  return bytes;
}

}  // namespace

int bench_checkpoint_rank(const BenchCheckpointOptions& options) {
  auto world = init(InitOptions{options.backend});
  const int rank = world->rank();
  const int n = world->size();
  const auto config = gpt_config(options);
  torch::manual_seed(0);
  ShardedModel model(config, world);
  const std::string dir = std::filesystem::absolute(options.dir).string();

  std::vector<double> save_s, load_s, reshard_s, single_s;
  bool cache_dropped = true;
  // Resharding target: half the ranks (at least one) load the N-rank checkpoint into FSDP.
  const int m = std::max(1, n / 2);
  auto sub = world->split(rank < m ? 0 : -1, rank);
  for (int round = 0; round < options.rounds; ++round) {
    save_s.push_back(timed(*world, [&] { save_checkpoint(dir, model.fsdp, &model.optimizer, 1); }));
    if (rank == 0) cache_dropped = drop_page_cache() && cache_dropped;
    load_s.push_back(timed(*world, [&] { load_checkpoint(dir, model.fsdp, &model.optimizer); }));
    if (rank == 0) cache_dropped = drop_page_cache() && cache_dropped;
    // Building the smaller world's model is not part of the load.
    std::unique_ptr<ShardedModel> smaller;
    if (sub) smaller = std::make_unique<ShardedModel>(config, sub);
    reshard_s.push_back(timed(*world, [&] {
      if (smaller) load_checkpoint(dir, smaller->fsdp, &smaller->optimizer);
    }));
    smaller.reset();
    if (rank == 0) cache_dropped = drop_page_cache() && cache_dropped;
    // One process, the whole model: what `dtrain checkpoint export` and a single-GPU user do.
    std::unique_ptr<models::GPT> whole;
    std::unique_ptr<torch::optim::AdamW> whole_optimizer;
    if (rank == 0) {
      whole = std::make_unique<models::GPT>(config);
      whole_optimizer = std::make_unique<torch::optim::AdamW>((*whole)->parameters(), torch::optim::AdamWOptions(1e-4));
      for (auto& p : (*whole)->parameters()) p.mutable_grad() = torch::zeros_like(p);
      whole_optimizer->step();
    }
    single_s.push_back(timed(*world, [&] {
      if (whole) load_checkpoint(dir, **whole, whole_optimizer.get());
    }));
  }

  if (rank == 0) {
    const double bytes = static_cast<double>(checkpoint_bytes(dir));
    const double mb = bytes / 1e6;
    const double per_rank = mb / n;
    auto row = [&](const char* what, int ranks, double seconds, double mb_per_rank) {
      std::printf("  %-34s %2d  %8.3f s  %9.1f MB/s per rank  %9.1f MB/s in all\n", what, ranks, seconds,
                  mb_per_rank / seconds, mb_per_rank * ranks / seconds);
    };
    std::printf("dtrain bench checkpoint: GPT %lld layers x %lld wide, %lld parameters; checkpoint %.1f MB "
                "(weights + AdamW state, fp32); %d ranks (%s), %d thread(s) per rank; median of %d rounds; "
                "page cache %s between save and loads\n",
                static_cast<long long>(config.n_layer), static_cast<long long>(config.n_embd),
                static_cast<long long>(models::GPTImpl::parameter_count(config)), mb, n, world->backend_name().c_str(),
                at::get_num_threads(), options.rounds, cache_dropped ? "dropped" : "NOT dropped (needs root)");
    std::printf("  %-34s %2s  %10s  %22s  %19s\n", "operation", "N", "time", "throughput", "");
    row("save (FSDP, fsync, rename)", n, median(save_s), per_rank);
    row("load (FSDP, same world size)", n, median(load_s), per_rank);
    std::string reshard = "reshard: load into FSDP on " + std::to_string(m);
    row(reshard.c_str(), m, median(reshard_s), mb / m);
    row("reshard: load into one process", 1, median(single_s), mb);
    std::fflush(stdout);
    if (!options.json_path.empty()) {
      const nlohmann::json document{{"parameters", models::GPTImpl::parameter_count(config)},
                                    {"checkpoint_bytes", bytes},
                                    {"nproc", n},
                                    {"backend", world->backend_name()},
                                    {"threads_per_rank", at::get_num_threads()},
                                    {"page_cache_dropped", cache_dropped},
                                    {"save_s", save_s},
                                    {"load_s", load_s},
                                    {"reshard_ranks", m},
                                    {"reshard_s", reshard_s},
                                    {"single_process_load_s", single_s}};
      std::ofstream(options.json_path) << document.dump(2) << "\n";
    }
    dtrain::detail::remove_tree(dir);  // Note [filesystem symbols from LibTorch]
  }
  world->blocking().barrier();
  return 0;
}

CLI::App* add_bench_checkpoint_subcommand(CLI::App& bench, BenchCheckpointOptions& options) {
  CLI::App* command = bench.add_subcommand(
      "checkpoint", "Sharded checkpoint save and load throughput (MB/s per rank) and resharding time");
  command->add_option("--nproc", options.nproc, "Number of ranks")->check(CLI::PositiveNumber);
  command->add_option("--backend", options.backend, "mpi or c10d")
      ->check(CLI::IsMember({"mpi", "c10d"}));
  command->add_option("--layers", options.layers, "GPT blocks")
      ->check(CLI::PositiveNumber)->capture_default_str();
  command->add_option("--dim", options.dim, "GPT width (a multiple of 8)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  command->add_option("--rounds", options.rounds, "Repetitions (the median is reported)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  command->add_option("--dir", options.dir, "Where to write the checkpoint (removed at the end)")
      ->capture_default_str();
  command->add_option("--json", options.json_path, "Also write the results as JSON to this path");
  return command;
}

}  // namespace dtrain::cli
