#include "bench_ddp.h"

#include "json_file.h"
#include "relaunch.h"

#include "dtrain/comm.h"
#include "dtrain/comm_hooks.h"
#include "dtrain/ddp.h"
#include "dtrain/models.h"
#include "common/timing.h"

#include <CLI/CLI.hpp>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

namespace dtrain::cli {
namespace {

// The workloads. bench/peers/ddp_peer.py builds the same layer shapes and
// batches for PyTorch; bench/ddp_compare.py refuses to compare runs whose
// parameter counts or batches differ.
//
// Communication-bound: 5.8M parameters (23 MiB of gradients) against a few
// milliseconds of compute for 8 samples.
const std::vector<int64_t> kMLPHidden{2048, 2048};
constexpr int64_t kMLPBatch = 8;
constexpr int kMLPSteps = 20;
// Compute-bound: 19M parameters (76 MiB of gradients) against ~0.5-1 s of
// compute per step on one core.
models::GPTConfig gpt_config() {
  models::GPTConfig config;
  config.n_layer = 6;
  config.n_embd = 512;
  config.n_head = 8;
  config.seq_len = 128;
  return config;
}
constexpr int64_t kGPTBatch = 4;
constexpr int kGPTSteps = 4;

// Timing does not depend on the values; any small step keeps them finite.
constexpr double kSgdLearningRate = 1e-3;

// ideal: each rank trains alone (the lower bound for any data-parallel step).
// naive: one blocking all-reduce per gradient after backward (what DDP's
// bucketing and overlap exist to beat). ddp, ddp-bf16: dtrain's engine.
const std::vector<std::string> kModes{"ideal", "naive", "ddp", "ddp-bf16"};

struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
};

// One mode's own copy of the model: DDP's gradient hooks stay on the
// parameters it wraps, so modes cannot share one model.
template <class Model>
struct Replica {
  std::string mode;
  Model model;
  std::unique_ptr<DistributedDataParallel<Model>> ddp;
  std::unique_ptr<torch::optim::SGD> optimizer;
  std::vector<double> step_seconds;          // the slowest rank's, per timed step
  std::vector<double> exposed_comm_seconds;  // ddp modes only, likewise
  int64_t bytes_sent_per_step = 0;
};

struct Result {
  std::string model;
  int64_t parameters = 0;
  int64_t batch_per_rank = 0;
  int steps_per_round = 0;
  std::string mode;
  double step_s = 0;
  double ratio_to_ideal = 0;
  std::optional<double> exposed_comm_s;
  int64_t bytes_sent_per_step = 0;
  std::vector<double> step_samples;
};

template <class Model>
double train_step(Replica<Model>& replica, Communicator& world, const Batch& batch) {
  const auto start = std::chrono::steady_clock::now();
  auto output = replica.ddp ? (*replica.ddp)(batch.inputs) : replica.model->forward(batch.inputs);
  // [B,10] (MLP) or [B,T,vocab] (GPT) against [B] or [B,T] targets.
  auto loss = torch::nn::functional::cross_entropy(output.flatten(0, -2), batch.targets.flatten());
  loss.backward();
  if (replica.mode == "naive") {
    for (auto& parameter : replica.model->parameters()) world.blocking().all_reduce(parameter.grad(), ReduceOp::Avg);
  }
  replica.optimizer->step();
  replica.optimizer->zero_grad();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

template <class Model>
void timed_round(Replica<Model>& replica, Communicator& world, const Batch& batch, int steps) {
  world.blocking().barrier();
  std::vector<double> times(steps), exposed(steps, 0.0);
  for (int i = 0; i < steps; ++i) {
    times[i] = train_step(replica, world, batch);
    if (replica.ddp) exposed[i] = replica.ddp->last_step().exposed_comm_s;
  }
  // Each step's slowest rank, gathered after the round so that no extra
  // collective runs between timed steps (in ideal mode ranks never meet).
  times.insert(times.end(), exposed.begin(), exposed.end());
  auto slowest = torch::tensor(times, torch::kFloat64);
  world.blocking().all_reduce(slowest, ReduceOp::Max);
  const double* values = slowest.data_ptr<double>();
  replica.step_seconds.insert(replica.step_seconds.end(), values, values + steps);
  if (replica.ddp) {
    replica.exposed_comm_seconds.insert(replica.exposed_comm_seconds.end(), values + steps, values + 2 * steps);
    replica.bytes_sent_per_step = replica.ddp->last_step().bytes_sent;
  }
}

template <class Model>
std::vector<Result> bench_model(const std::string& name, const std::function<Model()>& make_model,
                                const Batch& batch, int steps, const BenchDDPOptions& options,
                                const CommPtr& world) {
  std::vector<Replica<Model>> replicas;
  for (const auto& mode : kModes) {
    torch::manual_seed(0);  // every mode starts from the same weights
    Replica<Model> replica{mode, make_model(), nullptr, nullptr, {}, {}, 0};
    if (mode == "ddp") replica.ddp = std::make_unique<DistributedDataParallel<Model>>(replica.model, world);
    if (mode == "ddp-bf16") {
      DDPOptions ddp_options;
      ddp_options.comm_hook = hooks::bf16_compress();
      replica.ddp = std::make_unique<DistributedDataParallel<Model>>(replica.model, world, ddp_options);
    }
    replica.optimizer = std::make_unique<torch::optim::SGD>(replica.model->parameters(),
                                                            torch::optim::SGDOptions(kSgdLearningRate));
    replicas.push_back(std::move(replica));
  }
  const int64_t parameters = models::parameter_count(*replicas.front().model);
  int64_t gradient_bytes = 0;
  for (const auto& parameter : replicas.front().model->parameters())
    gradient_bytes += parameter.numel() * static_cast<int64_t>(parameter.element_size());

  // Warm-up (allocator, first-touch, MPI connections), then rounds in which
  // the modes take turns, so a noisy moment of the machine hits one round of
  // every mode rather than all of one mode.
  for (auto& replica : replicas)
    for (int i = 0; i < options.warmup; ++i) train_step(replica, *world, batch);
  for (int round = 0; round < options.rounds; ++round)
    for (auto& replica : replicas) timed_round(replica, *world, batch, steps);

  std::vector<Result> results;
  const double ideal = median(replicas.front().step_seconds);
  for (const auto& replica : replicas) {
    Result result{name, parameters, batch.inputs.size(0), steps, replica.mode, median(replica.step_seconds), 0,
                  std::nullopt, 0, replica.step_seconds};
    result.ratio_to_ideal = result.step_s / ideal;
    if (replica.ddp) {
      result.exposed_comm_s = median(replica.exposed_comm_seconds);
      result.bytes_sent_per_step = replica.bytes_sent_per_step;
    } else if (replica.mode == "naive") {
      result.bytes_sent_per_step = gradient_bytes;
    }
    results.push_back(result);
  }
  return results;
}

void print_results(const std::vector<Result>& results) {
  if (results.empty()) return;
  const auto& first = results.front();
  std::printf("\n%s: %.2fM parameters, per-rank batch %lld, median of %d rounds x %d steps\n", first.model.c_str(),
              first.parameters / 1e6, static_cast<long long>(first.batch_per_rank),
              static_cast<int>(first.step_samples.size()) / first.steps_per_round, first.steps_per_round);
  std::printf("%-10s %14s %9s %18s %14s\n", "mode", "step ms", "/ ideal", "exposed comm ms", "MiB sent/step");
  for (const auto& r : results) {
    std::printf("%-10s %14.2f %9.3f ", r.mode.c_str(), r.step_s * 1e3, r.ratio_to_ideal);
    if (r.exposed_comm_s) std::printf("%18.2f ", *r.exposed_comm_s * 1e3);
    else std::printf("%18s ", "-");
    std::printf("%14.2f\n", r.bytes_sent_per_step / double(1 << 20));
  }
  std::fflush(stdout);
}

}  // namespace

int bench_ddp_rank(const BenchDDPOptions& options) {
  auto world = init(InitOptions{options.backend});
  const int rank = world->rank();
  if (rank == 0) {
    std::printf("dtrain bench ddp: %d ranks, backend %s, %d intra-op thread(s) per rank, fp32, SGD\n", world->size(),
                world->backend_name().c_str(), at::get_num_threads());
    std::fflush(stdout);
  }

  std::vector<Result> results;
  auto add = [&](std::vector<Result> more) {
    if (rank == 0) print_results(more);
    results.insert(results.end(), more.begin(), more.end());
  };
  // Each rank its own samples, as in data-parallel training.
  torch::manual_seed(1 + rank);
  if (options.model == "mlp" || options.model == "all") {
    Batch batch{torch::randn({kMLPBatch, 1, 28, 28}), torch::randint(0, 10, {kMLPBatch}, torch::kLong)};
    add(bench_model<models::MLP>("mlp", [] { return models::MLP(kMLPHidden); }, batch,
                                 options.steps > 0 ? options.steps : kMLPSteps, options, world));
  }
  if (options.model == "gpt" || options.model == "all") {
    const auto config = gpt_config();
    Batch batch{torch::randint(0, config.vocab_size, {kGPTBatch, config.seq_len}, torch::kLong),
                torch::randint(0, config.vocab_size, {kGPTBatch, config.seq_len}, torch::kLong)};
    add(bench_model<models::GPT>("gpt", [&] { return models::GPT(config); }, batch,
                                 options.steps > 0 ? options.steps : kGPTSteps, options, world));
  }

  if (rank == 0 && !options.json_path.empty()) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& r : results) {
      rows.push_back({{"model", r.model},
                      {"parameters", r.parameters},
                      {"batch_per_rank", r.batch_per_rank},
                      {"steps_per_round", r.steps_per_round},
                      {"mode", r.mode},
                      {"step_s", r.step_s},
                      {"ratio_to_ideal", r.ratio_to_ideal},
                      {"exposed_comm_s", r.exposed_comm_s ? nlohmann::json(*r.exposed_comm_s) : nlohmann::json()},
                      {"bytes_sent_per_step", r.bytes_sent_per_step},
                      {"step_s_samples", r.step_samples}});
    }
    const nlohmann::json document{{"implementation", "dtrain"},
                                  {"nproc", world->size()},
                                  {"backend", world->backend_name()},
                                  {"threads_per_rank", at::get_num_threads()},
                                  {"rounds", options.rounds},
                                  {"warmup", options.warmup},
                                  {"results", rows}};
    if (!write_json_file(options.json_path, document)) {
      std::cerr << "dtrain: cannot write " << options.json_path << std::endl;
      return 1;
    }
  }
  return 0;
}

CLI::App* add_bench_ddp_subcommand(CLI::App& bench, BenchDDPOptions& options) {
  CLI::App* command = bench.add_subcommand("ddp", "Step time of dtrain DDP vs no communication and a naive all-reduce");
  command->add_option("--nproc", options.nproc, "Number of ranks")->check(CLI::PositiveNumber);
  command->add_option("--backend", options.backend, "mpi or c10d")->check(CLI::IsMember({"mpi", "c10d"}));
  command->add_option("--model", options.model, "mlp (communication-bound), gpt (compute-bound) or all")
      ->check(CLI::IsMember({"mlp", "gpt", "all"}));
  command->add_option("--steps", options.steps, "Timed steps per mode per round (default: mlp 20, gpt 4)")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--rounds", options.rounds, "Rounds in which the modes take turns")->check(CLI::PositiveNumber);
  command->add_option("--warmup", options.warmup, "Untimed steps per mode first")->check(CLI::NonNegativeNumber);
  command->add_option("--json", options.json_path, "Also write the results as JSON to this path");
  add_hosts_option(*command, options.hosts);
  return command;
}

}  // namespace dtrain::cli
