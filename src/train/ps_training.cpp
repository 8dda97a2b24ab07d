#include "train/ps_training.h"

#include "dtrain/data.h"
#include "dtrain/memory.h"
#include "dtrain/ps.h"
#include "dtrain/strategy_table.h"
#include "dtrain/trace.h"
#include "train/evaluate.h"
#include "train/initial_weights.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/model.h"
#include "train/optimizer.h"
#include "train/progress.h"
#include "train/stragglers.h"
#include "train/training_data.h"
#include "common/timing.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>

namespace dtrain::train {
namespace {

using Clock = SteadyClock;

ps::Mode mode_of(const std::string& strategy) {
  switch (strategy_info(strategy).synchrony) {
    case Synchrony::Lockstep: return ps::Mode::Sync;
    case Synchrony::Asynchronous: return ps::Mode::Async;
    case Synchrony::BoundedStaleness: return ps::Mode::SSP;
  }
  return ps::Mode::Sync;
}

// evaluate() runs the model through a Strategy; a worker's module is plain
// (the servers hold the optimizer), so forward is all it needs.
class PlainForward final : public Strategy {
 public:
  explicit PlainForward(Model& model) : model_(model) {}
  std::string name() const override { return "ps-worker"; }
  torch::Tensor forward(const torch::Tensor& inputs) override { return model_.forward(inputs); }
  std::vector<torch::Tensor> optimizer_parameters() override { return {}; }
  double clip_grad_norm(double) override { throw std::logic_error("ps workers do not clip"); }
  void save(const std::string&, torch::optim::Optimizer&, int64_t, const std::map<std::string, std::string>&) override {
    throw std::logic_error("ps workers do not save checkpoints");
  }
  CheckpointManifest load(const std::string&, torch::optim::Optimizer&) override {
    throw std::logic_error("ps workers do not load checkpoints");
  }
  void load_initial_weights(const std::string& path) override { train::load_initial_weights(*model_.module, path); }

 private:
  Model& model_;
};

}  // namespace

bool is_parameter_server(const std::string& strategy) {
  return strategy_info(strategy).engine == StrategyEngine::ParameterServer;
}

TrainResult run_parameter_server(const TrainConfig& config, CommPtr world) {
  const int world_size = world->size();
  const int rank = world->rank();
  const bool printing = config.print && rank == 0;  // rank 0 is always a worker
  memory::install_tracking_allocator();

  ps::Group group(world, {.mode = mode_of(config.strategy),
                          .servers = config.servers,
                          .staleness = mode_of(config.strategy) == ps::Mode::SSP ? config.staleness : 0,
                          .backup_workers = config.backup_workers});
  const int workers = group.workers();
  const bool lockstep = mode_of(config.strategy) == ps::Mode::Sync && config.backup_workers == 0;
  const OptimizerConfig optimizer_config{
      .name = config.optimizer, .lr = config.lr, .momentum = config.momentum, .weight_decay = config.weight_decay};

  // Workers only: the servers never read a sample.
  std::optional<TrainingData> data;
  std::optional<data::DistributedSampler> sampler;
  auto make_sampler = [&](std::vector<int64_t> sizes) {
    sampler.emplace(data::SamplerOptions{.dataset_size = data->train->size(),
                                         .global_batch_size = config.batch_size,
                                         .world_size = workers,
                                         .rank = group.worker_index(),
                                         .seed = config.seed,
                                         .shuffle = config.shuffle,
                                         .local_batch_sizes = std::move(sizes)});
  };
  int64_t total = config.steps;
  if (group.is_worker()) {
    data.emplace(load_training_data(config));
    make_sampler({});
    if (config.steps == 0) total = sampler->steps_for_epochs(config.epochs);
  }
  MetricsWriter metrics;
  if (rank == 0 && !config.metrics_path.empty()) metrics = MetricsWriter(config.metrics_path);

  const int64_t baseline = memory::live_bytes();
  memory::reset_peak();
  auto training_bytes = [baseline] { return std::max<int64_t>(0, memory::peak_bytes() - baseline); };

  torch::manual_seed(config.seed);  // the same layout everywhere; workers start from rank 0's values anyway
  Model model = build_model(config);
  if (!config.init_from.empty()) load_initial_weights(*model.module, config.init_from);
  // The start (the whole model on every rank, and --init-from's file) is
  // measured apart from the steps, as run_training does.
  const int64_t start_bytes = training_bytes();
  memory::reset_peak();
  const std::vector<torch::Tensor> parameters = model.module->parameters();

  TrainResult result;
  result.world_size = world_size;
  std::optional<ps::ServerReport> report;
  std::optional<Evaluation> final_eval;
  double train_seconds = 0;
  std::vector<double> step_times;
  std::vector<int64_t> balanced;

  // --trace: this rank's timeline, servers included (dtrain/trace.h).
  if (!config.trace_path.empty()) trace::start(rank);
  if (group.is_server()) {
    report = ps::serve(group, parameters, [&](std::vector<torch::Tensor> piece) {
      return make_optimizer(piece, optimizer_config);
    });
  } else {
    const int64_t batch = config.batch_size;
    const double scale = static_cast<double>(workers) / static_cast<double>(batch);  // Note [global batch loss]
    if (printing) {
      std::cout << "dtrain train: " << config.model << ", " << model.parameters << " parameters\n"
                << "  data      " << data->description << "\n"
                << "  strategy  " << config.strategy << " on " << world_size << " ranks: " << workers
                << (workers == 1 ? " worker" : " workers") << " (ranks 0-" << workers - 1 << "), " << config.servers
                << (config.servers == 1 ? " server" : " servers");
      if (mode_of(config.strategy) == ps::Mode::SSP) std::cout << ", staleness bound " << config.staleness;
      if (config.backup_workers > 0) std::cout << ", " << config.backup_workers << " backup worker(s)";
      if (config.slow_rank >= 0) std::cout << "; rank " << config.slow_rank << " slowed " << config.slow_factor << "x";
      std::cout << "\n  schedule  " << total << " steps of " << batch << " samples, " << config.optimizer << " lr "
                << config.lr << std::endl;
    }
    ps::Worker worker(group, parameters);
    torch::manual_seed(config.seed + 1 + static_cast<uint64_t>(rank));  // dropout masks differ per worker
    const LRSchedule schedule{.peak_lr = config.lr, .warmup_steps = config.warmup, .total_steps = total};
    Stragglers stragglers(config, rank, group.worker_index(), workers);
    ProgressLine progress(std::cout, printing && config.live_progress.value_or(ProgressLine::stdout_is_terminal()),
                          config.log_every);
    StepLog step_log(metrics, config.log_every, data->unit + "_per_s");
    PlainForward plain(model);
    model.module->train();
    const auto run_start = Clock::now();
    while (worker.next_step() < total) {
      const auto start = Clock::now();
      const int64_t step = worker.next_step();
      trace::Span step_span("step", trace::category::step, {{"step", step + 1}});
      const double lr = learning_rate(schedule, step);
      const std::vector<int64_t> indices = sampler->local_batch(step);
      const data::Batch part = data->train->get_batch(indices);
      stragglers.begin();
      for (auto& p : parameters) p.mutable_grad() = torch::Tensor();
      torch::Tensor local_sum;
      {
        trace::Span span("forward", trace::category::compute);
        local_sum = per_sample_loss(model.forward(part.inputs), part.targets).sum();
      }
      if (step + 1 == config.debug_nan_at_step && rank == 0) local_sum = local_sum * std::nan("");
      {
        trace::Span span("backward", trace::category::compute);
        (local_sum * scale).backward();
      }
      stragglers.end(static_cast<int64_t>(indices.size()));
      worker.push_and_pull(lr);  // its send and receive are the communicator's "comm" spans
      trace::sample_memory();

      double loss = local_sum.item<double>() / static_cast<double>(indices.size());  // this worker's part
      if (lockstep) {
        auto sum = local_sum.detach().to(torch::kFloat64).reshape({1}).clone();
        group.workers_comm()->all_reduce(sum, ReduceOp::Sum)->wait();
        loss = sum.item<double>() / static_cast<double>(batch);
      }
      if (!std::isfinite(loss))
        throw std::runtime_error("the loss is " + std::to_string(loss) + " at step " + std::to_string(step + 1) +
                                 ": training diverged; try a lower --lr or more --warmup");
      // The servers' step count, not step + 1: under ps-sync with backup
      // workers a late push is dropped and this worker jumps ahead to the
      // servers' version (Note [backup workers]), possibly past the last step,
      // and the step line must still name the step the run has reached.
      const int64_t done = worker.next_step();
      if (lockstep) {
        if (auto sizes = stragglers.rebalance(done, *group.workers_comm())) {
          make_sampler(*sizes);
          balanced = *sizes;
          if (printing)
            progress.message("balance: after step " + std::to_string(done) + " the workers' local batches are " +
                             format_split(*sizes) + " (measured samples/s)");
        }
      }
      const double step_seconds = seconds_since(start);
      step_times.push_back(step_seconds);
      result.losses.push_back(loss);
      const double units_per_step = static_cast<double>(batch * data->units_per_sample);
      if (printing)
        progress.update({.step = done,
                         .total = total,
                         .loss = loss,
                         .rate = units_per_step / step_seconds,
                         .rate_unit = data->unit + "/s",
                         .eta_s = step_seconds * static_cast<double>(total - done),
                         .peak_bytes_per_rank = {training_bytes()}});
      step_log.record(done, total, loss, lr, step_seconds, units_per_step);
      if (lockstep && config.eval_every > 0 && done % config.eval_every == 0 && done != total) {
        const Evaluation e = evaluate(plain, model, *data->validation, data->validation->size(),
                                      std::max<int64_t>(batch, 256), *group.workers_comm());
        nlohmann::ordered_json record{{"step", done}, {"eval_loss", e.loss}};
        if (e.accuracy) record["eval_accuracy"] = *e.accuracy;
        metrics.write(record);
      }
    }
    worker.finish();  // every worker now holds the servers' final parameters
    progress.finish();
    train_seconds = seconds_since(run_start);
    result.steps = total;
  }

  const ps::Summary summary = ps::summarize(group, report ? &*report : nullptr);
  if (!config.trace_path.empty()) {
    trace::write(config.trace_path, *world);  // collective: rank 0 writes every rank's events
    if (printing)
      std::cout << "trace: " << config.trace_path << " (open in https://ui.perfetto.dev; dtrain trace summary "
                << config.trace_path << ")" << std::endl;
  }
  if (group.is_worker()) {
    const int64_t eval_count = model.classification ? data->validation->size()
                                                    : std::min(data->validation->size(), config.eval_windows);
    PlainForward plain(model);
    final_eval = evaluate(plain, model, *data->validation, eval_count, std::max<int64_t>(config.batch_size, 256),
                          *group.workers_comm());
    nlohmann::ordered_json record{{"step", total}, {"eval_loss", final_eval->loss}};
    if (final_eval->accuracy) record["eval_accuracy"] = *final_eval->accuracy;
    metrics.write(record);
  }

  // Every rank's peak memory and RSS, servers included, and rank 0's time.
  auto stats = torch::zeros({3 * world_size}, torch::kFloat64);
  stats[rank] = static_cast<double>(training_bytes());
  stats[world_size + rank] = static_cast<double>(memory::peak_rss_bytes());
  stats[2 * world_size + rank] = static_cast<double>(start_bytes);
  world->all_reduce(stats, ReduceOp::Sum)->wait();
  result.peak_memory_bytes_per_rank.resize(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const auto steps = static_cast<int64_t>(stats[r].item<double>());
    const auto start = static_cast<int64_t>(stats[2 * world_size + r].item<double>());
    result.step_peak_bytes = std::max(result.step_peak_bytes, steps);
    result.construction_peak_bytes = std::max(result.construction_peak_bytes, start);
    result.peak_memory_bytes_per_rank[static_cast<size_t>(r)] = std::max(steps, start);
    result.peak_rss_bytes = std::max(result.peak_rss_bytes, static_cast<int64_t>(stats[world_size + r].item<double>()));
  }
  result.peak_memory_bytes =
      *std::max_element(result.peak_memory_bytes_per_rank.begin(), result.peak_memory_bytes_per_rank.end());
  result.loss = result.losses.empty() ? 0 : result.losses.back();
  result.step_time_s_median = median(step_times);
  if (final_eval) {
    result.eval_loss = final_eval->loss;
    result.eval_accuracy = final_eval->accuracy;
  }
  if (rank != 0) return result;

  // Samples whose gradients the servers applied: every server records each
  // applied push, and a push carries B / W samples.
  const double applied_samples = static_cast<double>(summary.updates) / config.servers *
                                 static_cast<double>(config.batch_size) / workers;
  const double samples_per_s = train_seconds > 0 ? applied_samples / train_seconds : 0;
  nlohmann::ordered_json final_line = final_record(config, result, model.parameters);
  final_line["workers"] = workers;
  final_line["servers"] = config.servers;
  final_line["train_time_s"] = train_seconds;
  final_line["samples_per_s"] = samples_per_s;
  final_line["updates"] = summary.updates;
  final_line["max_staleness"] = summary.max_staleness;
  final_line["mean_staleness"] = summary.mean_staleness;
  final_line["dropped_gradients"] = summary.dropped;
  final_line["max_clock_lead"] = summary.max_clock_lead;
  final_line["local_batch_sizes"] = balanced;
  metrics.write(final_line);
  if (printing) {
    std::ostringstream text;
    text.setf(std::ios::fixed);
    text.precision(4);
    text << (model.classification ? "test " : "validation ") << "loss " << *result.eval_loss;
    if (result.eval_accuracy) {
      text.precision(2);
      text << ", accuracy " << 100 * *result.eval_accuracy << "%";
    }
    text.precision(3);
    text << "\ndone: " << config.strategy << ", " << workers << " workers + " << config.servers << " server(s), "
         << result.steps << " steps in " << format_duration(train_seconds) << " (" << samples_per_s
         << " applied samples/s); " << summary.updates << " updates, staleness in server versions max "
         << summary.max_staleness << " mean " << summary.mean_staleness << ", clock lead max " << summary.max_clock_lead;
    if (mode_of(config.strategy) == ps::Mode::SSP) text << " (bound --staleness " << config.staleness << ")";
    text << ", " << summary.dropped << " dropped gradients\n";
    std::cout << text.str() << std::flush;
  }
  return result;
}

}  // namespace dtrain::train
