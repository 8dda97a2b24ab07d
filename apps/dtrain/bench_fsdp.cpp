#include "bench_fsdp.h"

#include "launch.h"
#include "json_file.h"
#include "relaunch.h"

#include "dtrain/comm.h"
#include "dtrain/ddp.h"
#include "dtrain/fsdp.h"
#include "dtrain/memory.h"
#include "dtrain/models.h"
#include "dtrain/plan.h"
#include "common/timing.h"

#include <CLI/CLI.hpp>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <thread>
#include <unistd.h>
#include <vector>

namespace dtrain::cli {
namespace {

// The workloads. bench/peers/fsdp_peer.py builds the speed model and batch
// for PyTorch; bench/fsdp_compare.py refuses to compare runs whose parameter
// counts or batches differ.
//
// Memory: 99.5M parameters (14 blocks of 7.1M, a 256-byte vocabulary), short
// windows so that a step stays within seconds per rank; the state (16 bytes
// per parameter under AdamW) dwarfs the activations, as in real training.
models::GPTConfig memory_config() {
  models::GPTConfig config;
  config.n_layer = 14;
  config.n_embd = 768;
  config.n_head = 12;
  config.seq_len = 64;
  return config;
}
constexpr int64_t kMemoryBatch = 2;  // per rank
// Speed: `dtrain bench ddp`'s 19M-parameter GPT and batch.
models::GPTConfig speed_config() {
  models::GPTConfig config;
  config.n_layer = 6;
  config.n_embd = 512;
  config.n_head = 8;
  config.seq_len = 128;
  return config;
}
constexpr int64_t kSpeedBatch = 4;  // per rank
constexpr int kSpeedWorld = 2;
constexpr double kAdamWLearningRate = 1e-4;
constexpr double kWeightDecay = 0.01;
// Per rank, what the tracking allocator does not see (LibTorch and MPI
// themselves, thread stacks), for deciding which runs fit the machine.
constexpr double kRuntimeAllowanceGiB = 0.4;
// fsdp-auto: prefetch chosen by the run (FSDPOptions::prefetch_tuning_steps,
// as dtrain train --fsdp-prefetch auto); its 2 + 2 x 3 tuning steps are extra
// warm-up, so its timed steps are the ones after the choice.
const std::vector<std::string> kSpeedModes{"ddp", "fsdp", "fsdp-no-prefetch", "fsdp-auto"};
constexpr int kPrefetchTuningSteps = 3;

using Clock = SteadyClock;
double gib(double bytes) { return bytes / (1024.0 * 1024 * 1024); }
double mib(double bytes) { return bytes / (1024.0 * 1024); }

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("bench fsdp: the job wrote no results to " + path);
  return nlohmann::json::parse(in);
}

plan::PlanOptions plan_options(const std::string& strategy, int world, int rank) {
  plan::PlanOptions options;
  plan::set_strategy(options, strategy);
  options.world_size = world;
  options.rank = rank;
  options.optimizer = plan::Optimizer::AdamW;
  return options;
}

// Whether the memory job of one strategy at `world` ranks fits the machine:
// its ranks together are planned to need at most --max-job-gib. The command
// outside the jobs reports the runs that do not fit as skipped; the memory
// job's ranks, which get the command's own flags (relaunch_as_job), work out
// the same list from them, so no strategy list is passed to the job.
struct JobFit {
  std::string strategy;
  double job_gib;
  bool fits;
};

std::vector<JobFit> memory_job_fits(const BenchFSDPOptions& options, int world) {
  const auto spec = plan::describe_gpt(memory_config(), kMemoryBatch, torch::kFloat32);
  // Building the model holds its full fp32 weights on every rank first.
  const double construction = 1.1 * static_cast<double>(spec.parameter_count()) * 4;
  std::vector<JobFit> fits;
  for (const auto& strategy : options.strategies) {
    const auto p = plan::make_plan(spec, plan_options(strategy, world, 0));
    const double job_gib =
        world * (gib(std::max<double>(static_cast<double>(p.peak.total()), construction)) + kRuntimeAllowanceGiB);
    fits.push_back({strategy, job_gib, !(job_gib > options.max_job_gib)});
  }
  return fits;
}

// One model wrapped for one strategy, with its optimizer.
struct Run {
  std::string mode;
  models::GPT model{nullptr};
  std::unique_ptr<DistributedDataParallel<models::GPT>> ddp;
  std::unique_ptr<FullyShardedDataParallel<models::GPT>> fsdp;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::vector<double> step_seconds;  // the slowest rank's, per timed step
};

std::unique_ptr<Run> make_run(const std::string& mode, const models::GPTConfig& config, const CommPtr& world) {
  auto run = std::make_unique<Run>();
  run->mode = mode;
  torch::manual_seed(0);  // every mode starts from the same weights
  run->model = models::GPT(config);
  if (mode == "ddp") {
    run->ddp = std::make_unique<DistributedDataParallel<models::GPT>>(run->model, world);
  } else {
    FSDPOptions options;
    if (mode == "fsdp-no-prefetch") {
      options.strategy = Sharding::Full;
      options.forward_prefetch = false;
      options.backward_prefetch = BackwardPrefetch::None;
    } else if (mode == "fsdp-auto") {
      options.strategy = Sharding::Full;
      options.prefetch_tuning_steps = kPrefetchTuningSteps;
    } else {
      plan::PlanOptions resolved;
      plan::set_strategy(resolved, mode);
      options.strategy = resolved.fsdp.strategy;
    }
    run->fsdp = std::make_unique<FullyShardedDataParallel<models::GPT>>(run->model, world, options);
  }
  run->optimizer = std::make_unique<torch::optim::AdamW>(
      run->model->parameters(), torch::optim::AdamWOptions(kAdamWLearningRate).weight_decay(kWeightDecay));
  return run;
}

// forward, loss, backward, optimizer step, zero_grad; the output and loss
// live until the step is done (as the plan assumes).
double train_step(Run& run, const torch::Tensor& tokens, const torch::Tensor& targets) {
  const auto start = Clock::now();
  auto output = run.ddp ? (*run.ddp)(tokens) : (*run.fsdp)(tokens);
  auto loss = torch::nn::functional::cross_entropy(output.flatten(0, -2), targets.flatten());
  loss.backward();
  run.optimizer->step();
  run.optimizer->zero_grad();
  return seconds_since(start);
}

// Values of every rank, in rank order (one all-gather of doubles).
std::vector<double> gather(Communicator& world, const std::vector<double>& mine) {
  auto shard = torch::tensor(mine, torch::kFloat64);
  auto full = torch::empty({static_cast<int64_t>(mine.size()) * world.size()}, torch::kFloat64);
  world.blocking().all_gather(shard, full);
  return std::vector<double>(full.data_ptr<double>(), full.data_ptr<double>() + full.numel());
}

// ------------------------------------------------------------- memory job

int memory_job(const BenchFSDPOptions& options, const CommPtr& world) {
  const int rank = world->rank(), size = world->size();
  const auto config = memory_config();
  const auto spec = plan::describe_gpt(config, kMemoryBatch, torch::kFloat32);
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& fit : memory_job_fits(options, size)) {
    if (!fit.fits) continue;
    const std::string& strategy = fit.strategy;
    world->blocking().barrier();
    const int64_t before = memory::live_bytes();
    memory::reset_peak();
    std::vector<double> step_peaks, step_times;
    double construction = 0;
    {
      auto run = make_run(strategy, config, world);
      torch::manual_seed(1 + rank);  // each rank its own samples
      auto tokens = torch::randint(0, config.vocab_size, {kMemoryBatch, config.seq_len}, torch::kLong);
      auto targets = torch::randint(0, config.vocab_size, {kMemoryBatch, config.seq_len}, torch::kLong);
      construction = static_cast<double>(memory::peak_bytes() - before);
      for (int step = 0; step < options.memory_steps; ++step) {
        memory::reset_peak();
        step_times.push_back(train_step(*run, tokens, targets));
        step_peaks.push_back(static_cast<double>(memory::peak_bytes() - before));
      }
    }
    const double leftover = static_cast<double>(memory::live_bytes() - before);
    // Steady state: the steps after the first (which creates the optimizer state).
    const double steady = *std::max_element(step_peaks.begin() + (step_peaks.size() > 1 ? 1 : 0), step_peaks.end());
    const auto predicted = plan::make_plan(spec, plan_options(strategy, size, rank));
    std::vector<double> mine{steady, step_peaks.front(), construction, static_cast<double>(predicted.peak.total()),
                             leftover, median(step_times)};
    const auto all = gather(*world, mine);
    if (rank == 0) {
      nlohmann::json ranks = nlohmann::json::array();
      for (int r = 0; r < size; ++r) {
        const double* v = all.data() + r * mine.size();
        const auto p = plan::make_plan(spec, plan_options(strategy, size, r));
        ranks.push_back({{"rank", r},
                         {"measured_peak_bytes", static_cast<int64_t>(v[0])},
                         {"first_step_peak_bytes", static_cast<int64_t>(v[1])},
                         {"construction_peak_bytes", static_cast<int64_t>(v[2])},
                         {"predicted_peak_bytes", p.peak.total()},
                         {"predicted_peak_moment", p.peak_moment},
                         {"predicted", {{"parameters", p.peak.parameters},
                                        {"gathered_parameters", p.peak.gathered_parameters},
                                        {"gradients", p.peak.gradients},
                                        {"reduction_buffers", p.peak.reduction_buffers},
                                        {"optimizer_state", p.peak.optimizer_state},
                                        {"activations", p.peak.activations}}},
                         {"ratio_measured_to_predicted", v[0] / static_cast<double>(p.peak.total())},
                         {"bytes_left_after_teardown", static_cast<int64_t>(v[4])},
                         {"median_step_s", v[5]}});
      }
      rows.push_back({{"strategy", strategy}, {"world_size", size}, {"ranks", ranks}});
      std::printf("  %d ranks, %-6s: rank 0 peak %8.1f MiB measured, %8.1f MiB predicted (%.3f); step %.1f s\n", size,
                  strategy.c_str(), mib(all[0]), mib(all[3]), all[0] / all[3], all[5]);
      std::fflush(stdout);
    }
  }
  if (rank == 0) {
    const nlohmann::json document{{"job", "memory"},
                                  {"world_size", size},
                                  {"threads_per_rank", at::get_num_threads()},
                                  {"backend", world->backend_name()},
                                  {"rows", rows}};
    if (!write_json_file(options.job_json, document)) throw std::runtime_error("cannot write " + options.job_json);
  }
  return 0;
}

// ------------------------------------------------------------- speed job

void timed_round(Run& run, Communicator& world, const torch::Tensor& tokens, const torch::Tensor& targets, int steps) {
  world.blocking().barrier();
  std::vector<double> times(steps);
  for (int i = 0; i < steps; ++i) times[i] = train_step(run, tokens, targets);
  // Each step's slowest rank, gathered after the round so that no extra
  // collective runs between timed steps.
  auto slowest = torch::tensor(times, torch::kFloat64);
  world.blocking().all_reduce(slowest, ReduceOp::Max);
  run.step_seconds.insert(run.step_seconds.end(), slowest.data_ptr<double>(), slowest.data_ptr<double>() + steps);
}

int speed_job(const BenchFSDPOptions& options, const CommPtr& world) {
  const int rank = world->rank();
  const auto config = speed_config();
  std::vector<std::unique_ptr<Run>> runs;
  for (const auto& mode : kSpeedModes) runs.push_back(make_run(mode, config, world));
  torch::manual_seed(1 + rank);
  auto tokens = torch::randint(0, config.vocab_size, {kSpeedBatch, config.seq_len}, torch::kLong);
  auto targets = torch::randint(0, config.vocab_size, {kSpeedBatch, config.seq_len}, torch::kLong);
  // Warm-up, then rounds in which the modes take turns, so that a noisy
  // moment of the machine hits one round of every mode.
  for (auto& run : runs) {
    const int tuning = run->mode == "fsdp-auto" ? 2 + 2 * kPrefetchTuningSteps : 0;
    for (int i = 0; i < options.warmup + tuning; ++i) train_step(*run, tokens, targets);
  }
  for (int round = 0; round < options.rounds; ++round)
    for (auto& run : runs) timed_round(*run, *world, tokens, targets, options.speed_steps);

  if (rank == 0) {
    const auto spec = plan::describe_gpt(config, kSpeedBatch, torch::kFloat32);
    const double ddp = median(runs.front()->step_seconds);
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& run : runs) {
      const auto strategy = run->mode.rfind("fsdp-", 0) == 0 ? std::string("fsdp") : run->mode;
      const auto p = plan::make_plan(spec, plan_options(strategy, world->size(), 0));
      const double step = median(run->step_seconds);
      rows.push_back({{"mode", run->mode},
                      {"step_s", step},
                      {"ratio_to_ddp", step / ddp},
                      {"planned_wire_bytes_per_step", p.wire_bytes_per_step},
                      {"step_s_samples", run->step_seconds}});
      if (run->mode == "fsdp-auto") {
        const auto tuning = run->fsdp->prefetch_tuning();
        rows.back()["prefetch_chosen"] = tuning.decided ? (tuning.prefetch ? "on" : "off") : "undecided";
        rows.back()["tuning_with_prefetch_s"] = tuning.with_prefetch_s;
        rows.back()["tuning_without_prefetch_s"] = tuning.without_prefetch_s;
      }
    }
    const nlohmann::json document{{"job", "speed"},
                                  {"world_size", world->size()},
                                  {"threads_per_rank", at::get_num_threads()},
                                  {"backend", world->backend_name()},
                                  {"parameters", models::GPTImpl::parameter_count(config)},
                                  {"batch_per_rank", kSpeedBatch},
                                  {"seq_len", config.seq_len},
                                  {"steps_per_round", options.speed_steps},
                                  {"rounds", options.rounds},
                                  {"warmup", options.warmup},
                                  {"optimizer", "adamw"},
                                  {"rows", rows}};
    if (!write_json_file(options.job_json, document)) throw std::runtime_error("cannot write " + options.job_json);
  }
  return 0;
}

// ------------------------------------------------------------- outside

// Starts one job: this command as the user gave it (every flag reaches the
// ranks, as for the other benchmarks), plus the part to run and where to
// write its results.
int run_job(const std::vector<std::string>& words, const BenchFSDPOptions& options, const std::string& job, int nproc,
            int threads, const std::string& job_json) {
  auto job_words = words;
  job_words.insert(job_words.end(), {"--job", job, "--job-json", job_json});
  // --hosts places the speed job's 2 ranks; the memory jobs' world sizes
  // (1-8) are no placement a host list of 2 slots could hold, so they stay local.
  return relaunch_as_job(job_words, nproc, options.backend, threads, job == "speed" ? options.hosts : "");
}

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/dtrain-bench-fsdp-" + std::to_string(getpid()) + "-" + name + ".json";
}

void print_memory_table(const nlohmann::json& rows) {
  // DDP's peak per world size, for the "/ DDP" column.
  std::map<int, double> ddp;
  for (const auto& row : rows)
    if (row["strategy"] == "ddp") ddp[row["world_size"].get<int>()] = row["ranks"][0]["measured_peak_bytes"].get<double>();
  std::printf("\nmemory: GPT %.1fM parameters, per-rank batch %lld x %lld tokens, AdamW, fp32; peak tensor bytes per "
              "rank over steady-state steps (tracking allocator)\n",
              models::GPTImpl::parameter_count(memory_config()) / 1e6, static_cast<long long>(kMemoryBatch),
              static_cast<long long>(memory_config().seq_len));
  std::printf("%5s %-6s %13s %13s %9s %9s %9s  %s\n", "ranks", "mode", "measured MiB", "planned MiB", "meas/plan",
              "worst", "/ DDP", "planned peak moment (rank 0)");
  for (const auto& row : rows) {
    const int world = row["world_size"].get<int>();
    const auto& ranks = row["ranks"];
    double worst = 1.0;  // the rank whose measurement is furthest from its plan
    for (const auto& r : ranks) {
      const double ratio = r["ratio_measured_to_predicted"].get<double>();
      if (std::abs(ratio - 1.0) > std::abs(worst - 1.0)) worst = ratio;
    }
    const double measured = ranks[0]["measured_peak_bytes"].get<double>();
    const double predicted = ranks[0]["predicted_peak_bytes"].get<double>();
    // Without a DDP run at this size (skipped to fit the machine), the
    // largest world size that has one: DDP's per-rank bytes do not depend on it.
    double reference = 0;
    for (const auto& [size, bytes] : ddp)
      if (size <= world) reference = bytes;
    char versus[16] = "-";
    if (reference > 0) std::snprintf(versus, sizeof versus, "%.3f", measured / reference);
    std::printf("%5d %-6s %13.1f %13.1f %9.3f %9.3f %9s  %s\n", world, row["strategy"].get<std::string>().c_str(),
                mib(measured), mib(predicted), measured / predicted, worst, versus,
                ranks[0]["predicted_peak_moment"].get<std::string>().c_str());
  }
  std::fflush(stdout);
}

void print_speed_table(const nlohmann::json& speed) {
  std::printf("\nspeed: GPT %.2fM parameters, %d ranks x %d thread(s), per-rank batch %lld x %lld tokens, AdamW; "
              "median of %d rounds x %d steps (slowest rank per step)\n",
              speed["parameters"].get<double>() / 1e6, speed["world_size"].get<int>(),
              speed["threads_per_rank"].get<int>(), speed["batch_per_rank"].get<long long>(),
              speed["seq_len"].get<long long>(), speed["rounds"].get<int>(), speed["steps_per_round"].get<int>());
  std::printf("%-18s %10s %9s %16s\n", "mode", "step ms", "/ ddp", "planned MiB sent");
  for (const auto& row : speed["rows"]) {
    std::printf("%-18s %10.1f %9.3f %16.1f\n", row["mode"].get<std::string>().c_str(), row["step_s"].get<double>() * 1e3,
                row["ratio_to_ddp"].get<double>(), mib(row["planned_wire_bytes_per_step"].get<double>()));
  }
  std::fflush(stdout);
}

}  // namespace

int bench_fsdp_rank(const BenchFSDPOptions& options) {
  // Before any tensor this process will count.
  memory::install_tracking_allocator();
  auto world = init(InitOptions{options.backend});
  if (options.job == "memory") return memory_job(options, world);
  if (options.job == "speed") return speed_job(options, world);
  throw std::invalid_argument("bench fsdp: run it without --job (it launches its own jobs)");
}

int bench_fsdp(const BenchFSDPOptions& options, const std::vector<std::string>& words) {
  // The jobs get the command line plus --job and --job-json (run_job).
  if (!options.job.empty() || !options.job_json.empty())
    throw std::invalid_argument("bench fsdp: --job and --job-json are set on the jobs it launches; run it without them");
  for (const auto& s : options.strategies) {
    plan::PlanOptions check;
    plan::set_strategy(check, s);  // names the allowed values
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  nlohmann::json document{{"implementation", "dtrain"}, {"backend", options.backend}, {"cores", cores}};
  const bool memory_part = std::find(options.parts.begin(), options.parts.end(), "memory") != options.parts.end();
  const bool speed_part = std::find(options.parts.begin(), options.parts.end(), "speed") != options.parts.end();

  if (memory_part) {
    const auto config = memory_config();
    const auto spec = plan::describe_gpt(config, kMemoryBatch, torch::kFloat32);
    nlohmann::json rows = nlohmann::json::array(), skipped = nlohmann::json::array();
    std::printf("dtrain bench fsdp: memory part, GPT of %.1fM parameters (%zu units), world sizes", spec.parameter_count() / 1e6,
                spec.units.size());
    for (int n : options.world_sizes) std::printf(" %d", n);
    std::printf(" on %d cores\n", cores);
    std::fflush(stdout);
    for (int n : options.world_sizes) {
      bool any_fits = false;
      for (const auto& fit : memory_job_fits(options, n)) {
        if (!fit.fits) {
          std::printf("  %d ranks, %-6s: skipped, planned %.1f GiB for the job > --max-job-gib %.1f\n", n,
                      fit.strategy.c_str(), fit.job_gib, options.max_job_gib);
          std::fflush(stdout);
          skipped.push_back({{"world_size", n}, {"strategy", fit.strategy}, {"planned_job_gib", fit.job_gib}});
        } else {
          any_fits = true;
        }
      }
      if (!any_fits) continue;
      const auto path = temp_path("memory-np" + std::to_string(n));
      const int code = run_job(words, options, "memory", n, default_threads_per_rank(n), path);
      if (code != 0) return code;
      const auto job = read_json(path);
      for (const auto& row : job["rows"]) rows.push_back(row);
      std::remove(path.c_str());
    }
    print_memory_table(rows);
    document["memory"] = {{"parameters", spec.parameter_count()},
                          {"n_layer", config.n_layer},
                          {"n_embd", config.n_embd},
                          {"n_head", config.n_head},
                          {"seq_len", config.seq_len},
                          {"vocab_size", config.vocab_size},
                          {"batch_per_rank", kMemoryBatch},
                          {"optimizer", "adamw"},
                          {"steps", options.memory_steps},
                          {"measured", "tracking allocator peak over steps 2.. minus the live bytes before the model "
                                       "was built (construction not included)"},
                          {"rows", rows},
                          {"skipped", skipped}};
  }

  if (speed_part) {
    std::printf("\ndtrain bench fsdp: speed part, %d ranks\n", kSpeedWorld);
    std::fflush(stdout);
    const auto path = temp_path("speed");
    const int code = run_job(words, options, "speed", kSpeedWorld, default_threads_per_rank(kSpeedWorld), path);
    if (code != 0) return code;
    document["speed"] = read_json(path);
    std::remove(path.c_str());
    print_speed_table(document["speed"]);
  }

  if (!options.json_path.empty() && !write_json_file(options.json_path, document)) {
    std::cerr << "dtrain: cannot write " << options.json_path << std::endl;
    return 1;
  }
  return 0;
}

CLI::App* add_bench_fsdp_subcommand(CLI::App& bench, BenchFSDPOptions& options) {
  CLI::App* command = bench.add_subcommand(
      "fsdp", "Per-rank peak memory of DDP, ZeRO-1/2 and full sharding next to dtrain plan; FSDP vs DDP step time");
  command->add_option("--parts", options.parts, "memory, speed (comma-separated)")
      ->delimiter(',')->check(CLI::IsMember({"memory", "speed"}))->capture_default_str();
  command->add_option("--world-sizes", options.world_sizes, "Memory part: world sizes (comma-separated)")
      ->delimiter(',')->check(CLI::Range(1, 64))->capture_default_str();
  command->add_option("--strategies", options.strategies, "Memory part: ddp, zero1, zero2, fsdp (comma-separated)")
      ->delimiter(',')->check(CLI::IsMember({"ddp", "zero1", "zero2", "fsdp"}))->capture_default_str();
  command->add_option("--backend", options.backend, "mpi or c10d")->check(CLI::IsMember({"mpi", "c10d"}));
  command->add_option("--memory-steps", options.memory_steps,
                       "Memory part: steps per run (the first builds the optimizer state; the peak is over the rest)")
      ->check(CLI::Range(2, 100))->capture_default_str();
  command->add_option("--max-job-gib", options.max_job_gib,
                       "Memory part: skip runs whose ranks together are planned to need more (GiB)")
      ->check(CLI::Range(0.1, 1e6))->capture_default_str();
  command->add_option("--speed-steps", options.speed_steps, "Speed part: timed steps per mode per round")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  command->add_option("--rounds", options.rounds, "Speed part: rounds in which the modes take turns")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  command->add_option("--warmup", options.warmup, "Speed part: untimed steps per mode first")
      ->check(CLI::Range(0, 1000))->capture_default_str();
  command->add_option("--json", options.json_path, "Also write the results as JSON to this path");
  add_hosts_option(*command, options.hosts);
  command->add_option("--job", options.job, "(internal) the part a launched job runs")
      ->check(CLI::IsMember({"memory", "speed"}))->group("");
  command->add_option("--job-json", options.job_json, "(internal) where the job writes its results")->group("");
  return command;
}

}  // namespace dtrain::cli
