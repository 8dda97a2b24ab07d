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
#include "train/ps_checkpoint.h"
#include "train/run_checkpoints.h"
#include "train/run_report.h"
#include "train/step_loop.h"
#include "train/stop_signals.h"
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

}  // namespace

bool is_parameter_server(const std::string& strategy) {
  return strategy_info(strategy).engine == StrategyEngine::ParameterServer;
}

namespace {

ps::Options group_options(const TrainConfig& c) {
  return {.mode = mode_of(c.strategy),
          .servers = c.servers,
          .staleness = mode_of(c.strategy) == ps::Mode::SSP ? c.staleness : 0,
          .backup_workers = c.backup_workers,
          .max_grad_norm = c.grad_clip,
          .skip_nonfinite = c.on_nonfinite == "skip"};
}

// One parameter-server run on this rank: the last config.servers ranks
// serve, the others train as workers (see ps_training.h) through the shared
// StepLoop, whose StepSource this class is on a worker: a step's update is
// the push and pull.
class ParameterServerRun final : public StepSource {
 public:
  ParameterServerRun(const TrainConfig& config, CommPtr world);
  TrainResult run();

  // StepSource (workers). The servers' step count, not a counter: under
  // ps-sync with backup workers a late push is dropped and this worker jumps
  // ahead to the servers' version (Note [backup workers]), possibly past the
  // last step, and the step lines must still name the step the run reached.
  int64_t next_step() const override { return worker_->next_step(); }
  StepOutcome run_step(int64_t step) override;
  Communicator* lockstep_ranks() override { return lockstep_ ? group_.workers_comm().get() : nullptr; }
  void resplit(const std::vector<int64_t>& sizes) override {
    make_sampler(sizes);
    balanced_ = sizes;
  }
  void save_checkpoint(int64_t step) override {
    worker_->announce_checkpoint(step);  // Note [parameter-server checkpoints]
    save_checkpoint(step, worker_held(HeldFor::Saving), nullptr);
  }
  Evaluation evaluate() override {
    // A worker's module is plain (the servers hold the optimizer): forward is all it takes.
    return train::evaluate([&](const torch::Tensor& inputs) { return model_.forward(inputs); }, model_,
                           *data_->validation, eval_count(), std::max<int64_t>(config_.batch_size, 256),
                           *group_.workers_comm());
  }

 private:
  void make_sampler(std::vector<int64_t> sizes);
  void print_banner() const;
  ps::ServerReport serve();
  void train_as_worker();
  HeldModel worker_held(HeldFor use) {
    return ps_worker_held(*model_.module, group_, config_.strategy, config_.optimizer, use);
  }
  int64_t eval_count() const {
    return model_.classification ? data_->validation->size() : std::min(data_->validation->size(), config_.eval_windows);
  }
  int64_t resume(const std::function<HeldModel(HeldFor)>& held, torch::optim::Optimizer* optimizer);
  void save_checkpoint(int64_t step, const HeldModel& held, torch::optim::Optimizer* optimizer);
  void evaluate_at_end();
  void gather_memory();
  void write_final_line(const ps::Summary& summary);
  void print_summary(const ps::Summary& summary) const;
  int64_t training_bytes() const { return std::max<int64_t>(0, memory::peak_bytes() - baseline_); }
  double samples_per_s(const ps::Summary& summary) const;

  const TrainConfig& config_;
  CommPtr world_;
  const int world_size_, rank_;
  const bool printing_;  // rank 0 is always a worker
  ps::Group group_;
  const int workers_;
  const bool lockstep_;
  std::optional<TrainingData> data_;  // workers only: the servers never read a sample
  std::optional<data::DistributedSampler> sampler_;
  int64_t total_ = 0;
  MetricsWriter metrics_;
  int64_t baseline_ = 0;
  Model model_;
  int64_t start_bytes_ = 0;
  std::vector<torch::Tensor> parameters_;

  TrainResult result_;
  std::optional<Evaluation> final_eval_;
  double train_seconds_ = 0;
  std::vector<int64_t> balanced_;
  int64_t last_saved_ = 0;
  // Workers, while training:
  ps::Worker* worker_ = nullptr;
  std::optional<Stragglers> stragglers_;
  std::optional<StepLoop> loop_;
};

ParameterServerRun::ParameterServerRun(const TrainConfig& config, CommPtr world)
    : config_(config),
      world_(std::move(world)),
      world_size_(world_->size()),
      rank_(world_->rank()),
      printing_(config.print && rank_ == 0),
      group_((memory::install_tracking_allocator(), world_), group_options(config)),
      workers_(group_.workers()),
      lockstep_(mode_of(config.strategy) == ps::Mode::Sync && config.backup_workers == 0) {
  total_ = config_.steps;
  if (group_.is_worker()) {
    data_.emplace(load_training_data(config_));
    make_sampler({});
    if (config_.steps == 0) total_ = sampler_->steps_for_epochs(config_.epochs);
  }
  // --epochs: only the workers know the data; the servers learn the step
  // count from worker 0 (a resume checks its checkpoint against it).
  auto steps = torch::tensor({total_}, torch::kInt64);
  world_->blocking().broadcast(steps, 0);
  total_ = steps.item<int64_t>();
  // A resumed run appends to the metrics file of the run it continues.
  if (rank_ == 0 && !config_.metrics_path.empty()) metrics_ = MetricsWriter(config_.metrics_path, config_.resume);

  baseline_ = memory::live_bytes();
  memory::reset_peak();
  torch::manual_seed(config_.seed);  // the same layout everywhere; workers start from rank 0's values anyway
  model_ = build_model(config_);
  if (!config_.init_from.empty()) load_initial_weights(*model_.module, config_.init_from, model_.hugging_face_layout);
  // The start (the whole model on every rank, and --init-from's file) is
  // measured apart from the steps, as run_training does.
  start_bytes_ = training_bytes();
  memory::reset_peak();
  parameters_ = model_.module->parameters();
  result_.world_size = world_size_;
}

void ParameterServerRun::make_sampler(std::vector<int64_t> sizes) {
  sampler_.emplace(sampler_options(config_, *data_, workers_, group_.worker_index(), std::move(sizes)));
}

TrainResult ParameterServerRun::run() {
  // --trace: this rank's timeline, servers included (dtrain/trace.h).
  if (!config_.trace_path.empty()) trace::start(rank_);
  // SIGINT/SIGTERM under ps-sync: the workers agree on it in their per-step
  // all-reduce, save a checkpoint and stop; the servers keep serving until
  // they have. (Asynchronous workers never meet, so they cannot agree on a
  // step: there a signal ends the run as usual.)
  std::optional<StopSignals> stop_signals;
  if (lockstep_ && !config_.checkpoint_dir.empty()) stop_signals.emplace();
  std::optional<ps::ServerReport> report;
  if (group_.is_server()) {
    report = serve();
    result_.stopped_by_signal = stop_signals ? StopSignals::received() : 0;
  } else {
    train_as_worker();
  }
  const ps::Summary summary = ps::summarize(group_, report ? &*report : nullptr);
  train::write_trace_if_asked(config_, *world_, printing_);
  if (group_.is_worker() && result_.stopped_by_signal == 0) evaluate_at_end();  // a stopped run ends promptly
  gather_memory();
  result_.loss = result_.losses.empty() ? 0 : result_.losses.back();
  result_.step_time_s_median = loop_ ? median(loop_->step_times()) : 0;
  if (final_eval_) {
    result_.eval_loss = final_eval_->loss;
    result_.eval_accuracy = final_eval_->accuracy;
  }
  if (rank_ != 0) return result_;
  write_final_line(summary);
  print_summary(summary);
  return result_;
}

void ParameterServerRun::print_banner() const {
  if (!printing_) return;
  const TrainConfig& c = config_;
  std::cout << "dtrain train: " << c.model << ", " << model_.parameters << " parameters\n"
            << "  data      " << data_->description << "\n"
            << "  strategy  " << c.strategy << " on " << world_size_ << " ranks: " << workers_
            << (workers_ == 1 ? " worker" : " workers") << " (ranks 0-" << workers_ - 1 << "), " << c.servers
            << (c.servers == 1 ? " server" : " servers");
  if (mode_of(c.strategy) == ps::Mode::SSP) std::cout << ", staleness bound " << c.staleness;
  if (c.backup_workers > 0) std::cout << ", " << c.backup_workers << " backup worker(s)";
  if (c.slow_rank >= 0) std::cout << "; rank " << c.slow_rank << " slowed " << c.slow_factor << "x";
  std::cout << "\n  schedule  " << total_ << " steps of " << c.batch_size << " samples, " << c.optimizer << " lr "
            << c.lr << std::endl;
}

// --resume on either side (collective over the world: servers and workers
// load together, each its own part; see ps_checkpoint.h). Returns the step
// to continue at.
int64_t ParameterServerRun::resume(const std::function<HeldModel(HeldFor)>& held, torch::optim::Optimizer* optimizer) {
  const int64_t first = resume_run(
      config_, total_,
      [&](const std::string& path) { return load_checkpoint(path, held(HeldFor::Loading), optimizer, world_); },
      world_, printing_, metrics_, result_);
  last_saved_ = first;
  return first;
}

void ParameterServerRun::save_checkpoint(int64_t step, const HeldModel& held, torch::optim::Optimizer* optimizer) {
  save_run_checkpoint(
      config_, step, total_, last_saved_,
      [&](const std::string& path, int64_t at, const std::map<std::string, std::string>& extra) {
        dtrain::save_checkpoint(path, held, optimizer, at, world_, extra);
      },
      world_);
  last_saved_ = step;
}

ps::ServerReport ParameterServerRun::serve() {
  const OptimizerConfig optimizer{
      .name = config_.optimizer, .lr = config_.lr, .momentum = config_.momentum, .weight_decay = config_.weight_decay};
  ps::Server server(group_, parameters_, [&](std::vector<torch::Tensor> piece) { return make_optimizer(piece, optimizer); });
  auto held = [&](HeldFor use) { return ps_server_held(*model_.module, group_, server, config_.strategy, use); };
  server.resume_at(resume(held, &server.optimizer()));
  return server.run([&](int64_t step) { save_checkpoint(step, held(HeldFor::Saving), &server.optimizer()); });
}

void ParameterServerRun::train_as_worker() {
  print_banner();
  ps::Worker worker(group_, parameters_);
  worker_ = &worker;
  torch::manual_seed(config_.seed + 1 + static_cast<uint64_t>(rank_));  // dropout masks differ per worker
  worker.resume_at(resume([&](HeldFor use) { return worker_held(use); }, nullptr));  // and a resume at the same world size restores their state
  stragglers_.emplace(config_, rank_, group_.worker_index(), workers_);
  const double units_per_step = static_cast<double>(config_.batch_size * data_->units_per_sample);
  loop_.emplace(config_, total_, units_per_step, data_->unit, printing_, metrics_, *stragglers_, result_);
  model_.module->train();
  const auto run_start = Clock::now();
  result_.steps = loop_->run(*this);  // less than total_ when stopped by a signal
  worker.finish();  // every worker now holds the servers' final parameters
  worker_ = nullptr;
  loop_->finish();
  train_seconds_ = seconds_since(run_start);
}

StepOutcome ParameterServerRun::run_step(int64_t step) {
  StepOutcome outcome;
  outcome.lr = learning_rate({.peak_lr = config_.lr, .warmup_steps = config_.warmup, .total_steps = total_}, step);
  const std::vector<int64_t> indices = sampler_->local_batch(step);
  const data::Batch part = data_->train->get_batch(indices);
  stragglers_->begin();
  for (auto& p : parameters_) p.mutable_grad() = torch::Tensor();
  torch::Tensor local_sum;
  {
    trace::Span span("forward", trace::category::compute);
    local_sum = model_.loss(model_.forward(part.inputs), part.targets).sum();
  }
  if (step + 1 == config_.debug_nan_at_step && rank_ == 0) local_sum = local_sum * std::nan("");
  {
    trace::Span span("backward", trace::category::compute);
    // Note [global batch loss], with W = the number of workers.
    (local_sum * (static_cast<double>(workers_) / static_cast<double>(config_.batch_size))).backward();
  }
  stragglers_->end(static_cast<int64_t>(indices.size()));
  // Its send and receive are the communicator's "comm" spans.
  const ps::Worker::PushResult push = worker_->push_and_pull(outcome.lr, std::isfinite(local_sum.item<double>()));
  outcome.grad_norm = push.grad_norm;
  outcome.skipped = push.skipped;
  trace::sample_memory();

  outcome.loss = local_sum.item<double>() / static_cast<double>(indices.size());  // this worker's part
  if (lockstep_) {  // the global loss, and whether a worker was asked to stop
    auto sums = torch::tensor({local_sum.item<double>(), static_cast<double>(StopSignals::received())}, torch::kFloat64);
    group_.workers_comm()->blocking().all_reduce(sums, ReduceOp::Sum);
    outcome.loss = sums[0].item<double>() / static_cast<double>(config_.batch_size);
    outcome.stop_requested = sums[1].item<double>() != 0;
  }
  outcome.peak_bytes_per_rank = {training_bytes()};
  return outcome;
}

void ParameterServerRun::evaluate_at_end() {
  final_eval_ = evaluate();
  metrics_.write(eval_record(total_, *final_eval_));
}

// Every rank's peak memory and RSS, servers included.
void ParameterServerRun::gather_memory() {
  auto stats = torch::zeros({3 * world_size_}, torch::kFloat64);
  stats[rank_] = static_cast<double>(training_bytes());
  stats[world_size_ + rank_] = static_cast<double>(memory::peak_rss_bytes());
  stats[2 * world_size_ + rank_] = static_cast<double>(start_bytes_);
  world_->blocking().all_reduce(stats, ReduceOp::Sum);
  result_.peak_memory_bytes_per_rank.resize(static_cast<size_t>(world_size_));
  for (int r = 0; r < world_size_; ++r) {
    const auto steps = static_cast<int64_t>(stats[r].item<double>());
    const auto start = static_cast<int64_t>(stats[2 * world_size_ + r].item<double>());
    result_.step_peak_bytes = std::max(result_.step_peak_bytes, steps);
    result_.construction_peak_bytes = std::max(result_.construction_peak_bytes, start);
    result_.peak_memory_bytes_per_rank[static_cast<size_t>(r)] = std::max(steps, start);
    result_.peak_rss_bytes = std::max(result_.peak_rss_bytes, static_cast<int64_t>(stats[world_size_ + r].item<double>()));
  }
  result_.peak_memory_bytes =
      *std::max_element(result_.peak_memory_bytes_per_rank.begin(), result_.peak_memory_bytes_per_rank.end());
}

// Samples whose gradients the servers applied: every server records each
// applied push, and a push carries B / W samples.
double ParameterServerRun::samples_per_s(const ps::Summary& summary) const {
  const double applied_samples = static_cast<double>(summary.updates) / config_.servers *
                                 static_cast<double>(config_.batch_size) / workers_;
  return train_seconds_ > 0 ? applied_samples / train_seconds_ : 0;
}

void ParameterServerRun::write_final_line(const ps::Summary& summary) {
  nlohmann::ordered_json final_line = final_record(config_, result_, model_.parameters);
  final_line["workers"] = workers_;
  final_line["servers"] = config_.servers;
  final_line["train_time_s"] = train_seconds_;
  final_line["samples_per_s"] = samples_per_s(summary);
  final_line["updates"] = summary.updates;
  final_line["max_staleness"] = summary.max_staleness;
  final_line["mean_staleness"] = summary.mean_staleness;
  final_line["dropped_gradients"] = summary.dropped;
  final_line["max_clock_lead"] = summary.max_clock_lead;
  final_line["local_batch_sizes"] = balanced_;
  metrics_.write(final_line);
}

void ParameterServerRun::print_summary(const ps::Summary& summary) const {
  if (!printing_) return;
  if (result_.stopped_by_signal != 0) {
    std::cout << signal_name(result_.stopped_by_signal) << ": stopped after step " << result_.steps
              << "; checkpoint saved in " << checkpoint_path(config_.checkpoint_dir, result_.steps)
              << " (continue with the same command and --resume)" << std::endl;
    return;
  }
  std::ostringstream text;
  text.setf(std::ios::fixed);
  text.precision(4);
  text << (model_.classification ? "test " : "validation ") << "loss " << *result_.eval_loss;
  if (result_.eval_accuracy) {
    text.precision(2);
    text << ", accuracy " << 100 * *result_.eval_accuracy << "%";
  }
  text.precision(3);
  text << "\ndone: " << config_.strategy << ", " << workers_ << " workers + " << config_.servers << " server(s), "
       << result_.steps << " steps in " << format_duration(train_seconds_) << " (" << samples_per_s(summary)
       << " applied samples/s); " << summary.updates << " updates, staleness in server versions max "
       << summary.max_staleness << " mean " << summary.mean_staleness << ", clock lead max " << summary.max_clock_lead;
  if (mode_of(config_.strategy) == ps::Mode::SSP) text << " (bound --staleness " << config_.staleness << ")";
  text << ", " << summary.dropped << " dropped gradients\n";
  std::cout << text.str() << std::flush;
}

}  // namespace

TrainResult run_parameter_server(const TrainConfig& config, CommPtr world) {
  return ParameterServerRun(config, std::move(world)).run();
}

}  // namespace dtrain::train
