#include "bench_collectives.h"

#include "json_file.h"
#include "relaunch.h"

#include "dtrain/comm.h"
#include "dtrain/plan.h"
#include "common/timing.h"

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <mpi.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <vector>

namespace dtrain::cli {
namespace {

enum class Op { AllReduce, AllGather, ReduceScatter };

const char* op_name(Op op) {
  switch (op) {
    case Op::AllReduce: return "all_reduce";
    case Op::AllGather: return "all_gather";
    case Op::ReduceScatter: return "reduce_scatter";
  }
  return "?";
}

const char* mpi_call(Op op, bool even) {
  switch (op) {
    case Op::AllReduce: return "MPI_Allreduce";
    case Op::AllGather: return even ? "MPI_Allgather" : "MPI_Allgatherv";
    case Op::ReduceScatter: return even ? "MPI_Reduce_scatter_block" : "MPI_Reduce_scatter";
  }
  return "?";
}

// On c10d there is no raw column: the process group is only reachable through dtrain.
const char* c10d_call(Op op) {
  switch (op) {
    case Op::AllReduce: return "gloo allreduce";
    case Op::AllGather: return "gloo all_gather_single";
    case Op::ReduceScatter: return "gloo reduce_scatter_single";
  }
  return "?";
}

// nccl-tests' bus bandwidth: the per-link traffic of an optimal ring, so
// numbers compare across world sizes. `bytes` is the full buffer size.
double bus_bandwidth_gbps(Op op, int64_t bytes, double seconds, int world) {
  const double algbw = static_cast<double>(bytes) / seconds / 1e9;
  if (world == 1) return algbw;
  const double n = world;
  return op == Op::AllReduce ? algbw * 2.0 * (n - 1) / n : algbw * (n - 1) / n;
}

constexpr int kRounds = 5;

// Mean seconds per call over `iterations`, the slowest rank's.
double time_calls(Communicator& world, int iterations, const std::function<void()>& call) {
  world.barrier()->wait();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) call();
  const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
  auto slowest = torch::tensor({mine}, torch::kFloat64);
  world.all_reduce(slowest, ReduceOp::Max)->wait();
  return slowest.item<double>();
}

std::string human_bytes(int64_t bytes) {
  char text[32];
  if (bytes >= (int64_t{1} << 20)) std::snprintf(text, sizeof(text), "%lld MiB", static_cast<long long>(bytes >> 20));
  else std::snprintf(text, sizeof(text), "%lld KiB", static_cast<long long>(bytes >> 10));
  return text;
}

struct Row {
  Op op;
  int64_t bytes;
  std::string algorithm;
  double dtrain_busbw;
  double blocking_busbw;  // through Communicator::blocking()
  std::optional<double> raw_busbw;
  // Seconds per call (the median round's).
  double dtrain_seconds, blocking_seconds;
  std::optional<double> raw_seconds;
};

// Each operation's ring α-β link (Note [link cost], src/plan/link_cost.cpp)
// fitted to dtrain's times per call: t = hops x α + wire bytes / β, the
// cost model dtrain plan's step time is to use (issue 40). None at 1 rank,
// or where the times do not grow with the size.
struct LinkFit {
  Op op;
  plan::Link link;  // per hop
};

std::vector<LinkFit> fit_links(const std::vector<Row>& rows, int n) {
  std::vector<LinkFit> fits;
  if (n < 2) return fits;
  for (Op op : {Op::AllReduce, Op::AllGather, Op::ReduceScatter}) {
    std::vector<std::pair<int64_t, double>> points;
    for (const Row& row : rows) {
      if (row.op != op) continue;
      const int64_t share = row.bytes / n * (n - 1);
      points.emplace_back(op == Op::AllReduce ? 2 * share : share, row.dtrain_seconds);
    }
    try {
      plan::Link link = plan::fit_link(points);
      link.latency_seconds /= static_cast<double>(plan::latency_hops(op_name(op), n));
      fits.push_back({op, link});
    } catch (const std::invalid_argument&) {
      // fewer than two sizes, or noise beyond the sizes' effect: no link to report
    }
  }
  return fits;
}

}  // namespace

int bench_collectives_rank(const BenchCollectivesOptions& options) {
  auto world = init(InitOptions{options.backend});
  const int n = world->size();
  const int rank = world->rank();
  const bool raw_mpi = world->backend_name() == "mpi";
  std::vector<Row> rows;

  for (Op op : {Op::AllReduce, Op::AllGather, Op::ReduceScatter}) {
    for (int64_t bytes = options.min_bytes; bytes <= options.max_bytes; bytes *= 4) {
      // Full buffer of fp32, a multiple of the world size so shards are equal.
      const int64_t elements = std::max<int64_t>(n, bytes / 4 / n * n);
      const int64_t actual_bytes = elements * 4;
      const int64_t shard_elements = elements / n;
      auto full = torch::ones({elements}, torch::kFloat32);
      auto shard = torch::ones({shard_elements}, torch::kFloat32);
      // Each measurement moves ~128 MiB (2 to 100 calls); kRounds measurements
      // of each path, taken in turns, and the median of each is reported, so a
      // noisy moment of a shared machine lands in one round, not in the result.
      const int iterations = static_cast<int>(std::clamp<int64_t>((int64_t{128} << 20) / actual_bytes, 2, 100));

      // dtrain twice: the queued operation and its Work (what engines that
      // overlap use), and the blocking form for callers that wait at once.
      std::function<void()> through_dtrain, through_blocking, through_raw;
      switch (op) {
        case Op::AllReduce:
          through_dtrain = [&] { world->all_reduce(full)->wait(); };
          through_blocking = [&] { world->blocking().all_reduce(full); };
          break;
        case Op::AllGather:
          through_dtrain = [&] { world->all_gather(shard, full)->wait(); };
          through_blocking = [&] { world->blocking().all_gather(shard, full); };
          break;
        case Op::ReduceScatter:
          through_dtrain = [&] { world->reduce_scatter(full, shard)->wait(); };
          through_blocking = [&] { world->blocking().reduce_scatter(full, shard); };
          break;
      }
      if (raw_mpi) {
        const int full_count = static_cast<int>(elements);
        const int shard_count = static_cast<int>(shard_elements);
        switch (op) {
          case Op::AllReduce:
            through_raw = [&, full_count] {
              MPI_Allreduce(MPI_IN_PLACE, full.data_ptr(), full_count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            };
            break;
          case Op::AllGather:
            through_raw = [&, shard_count] {
              MPI_Allgather(shard.data_ptr(), shard_count, MPI_FLOAT, full.data_ptr(), shard_count, MPI_FLOAT,
                            MPI_COMM_WORLD);
            };
            break;
          case Op::ReduceScatter:
            through_raw = [&, shard_count] {
              MPI_Reduce_scatter_block(full.data_ptr(), shard.data_ptr(), shard_count, MPI_FLOAT, MPI_SUM,
                                       MPI_COMM_WORLD);
            };
            break;
        }
      }
      // Warm-up, once per path: first touch of the buffers, connection setup.
      through_dtrain();
      through_blocking();
      if (through_raw) through_raw();
      std::vector<double> dtrain_rounds, blocking_rounds, raw_rounds;
      for (int round = 0; round < kRounds; ++round) {
        dtrain_rounds.push_back(time_calls(*world, iterations, through_dtrain));
        blocking_rounds.push_back(time_calls(*world, iterations, through_blocking));
        if (through_raw) raw_rounds.push_back(time_calls(*world, iterations, through_raw));
      }
      Row row{op, actual_bytes, raw_mpi ? mpi_call(op, true) : c10d_call(op), 0.0, 0.0, std::nullopt,
              median(dtrain_rounds), median(blocking_rounds), std::nullopt};
      row.dtrain_busbw = bus_bandwidth_gbps(op, actual_bytes, row.dtrain_seconds, n);
      row.blocking_busbw = bus_bandwidth_gbps(op, actual_bytes, row.blocking_seconds, n);
      if (through_raw) {
        row.raw_seconds = median(raw_rounds);
        row.raw_busbw = bus_bandwidth_gbps(op, actual_bytes, *row.raw_seconds, n);
      }
      rows.push_back(row);
      if (rank == 0) {
        std::printf("%-15s %9s  %-26s dtrain %8.3f  blocking %8.3f GB/s", op_name(op),
                    human_bytes(actual_bytes).c_str(), row.algorithm.c_str(), row.dtrain_busbw, row.blocking_busbw);
        if (row.raw_busbw)
          std::printf("   raw %8.3f GB/s   dtrain/raw %5.3f  blocking/raw %5.3f  (%.1f / %.1f / %.1f us)", *row.raw_busbw,
                      row.dtrain_busbw / *row.raw_busbw, row.blocking_busbw / *row.raw_busbw,
                      row.dtrain_seconds * 1e6, row.blocking_seconds * 1e6, *row.raw_seconds * 1e6);
        std::printf("\n");
        std::fflush(stdout);
      }
    }
  }

  if (rank == 0) {
    std::printf("\nbus bandwidth as defined by nccl-tests (GB/s = 1e9 bytes/s), %d ranks, backend %s, fp32\n", n,
                world->backend_name().c_str());
    if (!raw_mpi) std::printf("no raw column: on c10d the process group is reachable only through dtrain\n");
    const std::vector<LinkFit> links = fit_links(rows, n);
    for (const auto& fit : links)
      std::printf("link fit, %-14s (ring alpha-beta of dtrain's times): latency %.2f us per hop, bandwidth %.3f GB/s\n",
                  op_name(fit.op), fit.link.latency_seconds * 1e6, fit.link.bytes_per_second / 1e9);
    if (!options.json_path.empty()) {
      nlohmann::json results = nlohmann::json::array();
      for (const auto& row : rows) {
        results.push_back({{"op", op_name(row.op)},
                           {"bytes", row.bytes},
                           {"backend", world->backend_name()},
                           {"algorithm", row.algorithm},
                           {"nproc", n},
                           {"dtrain_busbw_gbps", row.dtrain_busbw},
                           {"raw_busbw_gbps", row.raw_busbw ? nlohmann::json(*row.raw_busbw) : nlohmann::json()},
                           {"dtrain_blocking_busbw_gbps", row.blocking_busbw},
                           {"dtrain_us", row.dtrain_seconds * 1e6},
                           {"dtrain_blocking_us", row.blocking_seconds * 1e6},
                           {"raw_us", row.raw_seconds ? nlohmann::json(*row.raw_seconds * 1e6) : nlohmann::json()}});
      }
      nlohmann::json fitted = nlohmann::json::array();
      for (const auto& fit : links)
        fitted.push_back({{"op", op_name(fit.op)},
                          {"latency_seconds", fit.link.latency_seconds},
                          {"bytes_per_second", fit.link.bytes_per_second}});
      if (!write_json_file(options.json_path, nlohmann::json{{"threads_per_rank", at::get_num_threads()},
                                                             {"results", results},
                                                             {"links", fitted}})) {
        std::cerr << "dtrain: cannot write " << options.json_path << std::endl;
        return 1;
      }
    }
  }
  return 0;
}

CLI::App* add_bench_collectives_subcommand(CLI::App& bench, BenchCollectivesOptions& options) {
  CLI::App* command = bench.add_subcommand("collectives", "Bus bandwidth of dtrain's collectives vs the raw backend");
  command->add_option("--nproc", options.nproc, "Number of ranks")->check(CLI::PositiveNumber);
  command->add_option("--backend", options.backend, "mpi or c10d")->check(CLI::IsMember({"mpi", "c10d"}));
  command->add_option("--json", options.json_path, "Also write the results as JSON to this path");
  add_hosts_option(*command, options.hosts);
  // Hosts that share one machine's cores (bench/network.sh's namespaces) need
  // fewer threads than the launcher's cores / ranks per host.
  command->add_option("--threads-per-rank", options.threads_per_rank,
                      "Intra-op threads per rank (default: cores / ranks per host)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--max-bytes", options.max_bytes, "Largest message in bytes (default 256 MiB)")
      ->check(CLI::Range(int64_t{4} << 10, int64_t{4} << 30));
  return command;
}

}  // namespace dtrain::cli
