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

namespace {

// This worker's step: its loss (the global batch's under lockstep, else its
// own part's mean), learning rate, and what the servers did with it.
struct WorkerStep {
  double loss = 0;
  double lr = 0;
  ps::Worker::PushResult push;
};

ps::Options group_options(const TrainConfig& c) {
  return {.mode = mode_of(c.strategy),
          .servers = c.servers,
          .staleness = mode_of(c.strategy) == ps::Mode::SSP ? c.staleness : 0,
          .backup_workers = c.backup_workers,
          .max_grad_norm = c.grad_clip,
          .skip_nonfinite = c.on_nonfinite == "skip"};
}

// One parameter-server run on this rank: the last config.servers ranks
// serve, the others train as workers (see ps_training.h).
class ParameterServerRun {
 public:
  ParameterServerRun(const TrainConfig& config, CommPtr world);
  TrainResult run();

 private:
  void make_sampler(std::vector<int64_t> sizes);
  void print_banner() const;
  ps::ServerReport serve();
  void train_as_worker();
  WorkerStep worker_step(ps::Worker& worker, int64_t step, Stragglers& stragglers);
  void after_worker_step(int64_t done, const WorkerStep& outcome);
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
  std::vector<double> step_times_;
  std::vector<int64_t> balanced_;
  std::optional<ProgressLine> progress_;
  int64_t last_saved_ = 0;
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
  // A resumed run appends to the metrics file of the run it continues.
  if (rank_ == 0 && !config_.metrics_path.empty()) metrics_ = MetricsWriter(config_.metrics_path, config_.resume);

  baseline_ = memory::live_bytes();
  memory::reset_peak();
  torch::manual_seed(config_.seed);  // the same layout everywhere; workers start from rank 0's values anyway
  model_ = build_model(config_);
  if (!config_.init_from.empty()) load_initial_weights(*model_.module, config_.init_from);
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
  std::optional<ps::ServerReport> report;
  if (group_.is_server()) {
    report = serve();
  } else {
    train_as_worker();
  }
  const ps::Summary summary = ps::summarize(group_, report ? &*report : nullptr);
  train::write_trace_if_asked(config_, *world_, printing_);
  if (group_.is_worker()) evaluate_at_end();
  gather_memory();
  result_.loss = result_.losses.empty() ? 0 : result_.losses.back();
  result_.step_time_s_median = median(step_times_);
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
  if (printing_)
    progress_->message("checkpoint: step " + std::to_string(step) + " saved in " + checkpoint_path(config_.checkpoint_dir, step));
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
  auto held = [&](HeldFor use) {
    return ps_worker_held(*model_.module, group_, config_.strategy, config_.optimizer, use);
  };
  torch::manual_seed(config_.seed + 1 + static_cast<uint64_t>(rank_));  // dropout masks differ per worker
  worker.resume_at(resume(held, nullptr));  // and a resume at the same world size restores their state
  Stragglers stragglers(config_, rank_, group_.worker_index(), workers_);
  progress_.emplace(std::cout, printing_ && config_.live_progress.value_or(ProgressLine::stdout_is_terminal()),
                    config_.log_every);
  StepLog step_log(metrics_, config_.log_every, data_->unit + "_per_s");
  PlainForward plain(model_);
  model_.module->train();
  const double units_per_step = static_cast<double>(config_.batch_size * data_->units_per_sample);
  const auto run_start = Clock::now();
  while (worker.next_step() < total_) {
    const auto start = Clock::now();
    const int64_t before = worker.next_step();
    const WorkerStep outcome = worker_step(worker, before, stragglers);
    // The servers' step count, not step + 1: under ps-sync with backup
    // workers a late push is dropped and this worker jumps ahead to the
    // servers' version (Note [backup workers]), possibly past the last step,
    // and the step line must still name the step the run has reached.
    const int64_t done = worker.next_step();
    after_worker_step(done, outcome);
    if (lockstep_) {
      if (auto sizes = stragglers.rebalance(done, *group_.workers_comm())) {
        make_sampler(*sizes);
        balanced_ = *sizes;
        if (printing_)
          progress_->message("balance: after step " + std::to_string(done) + " the workers' local batches are " +
                             format_split(*sizes) + " (measured samples/s)");
      }
    }
    if (checkpoint_due(config_, before, done, total_)) {
      worker.announce_checkpoint(done);  // Note [parameter-server checkpoints]
      save_checkpoint(done, held(HeldFor::Saving), nullptr);
    }
    const double step_seconds = seconds_since(start);
    step_times_.push_back(step_seconds);
    result_.losses.push_back(outcome.loss);
    if (printing_)
      progress_->update({.step = done,
                         .total = total_,
                         .loss = outcome.loss,
                         .rate = units_per_step / step_seconds,
                         .rate_unit = data_->unit + "/s",
                         .eta_s = step_seconds * static_cast<double>(total_ - done),
                         .peak_bytes_per_rank = {training_bytes()}});
    step_log.record(done, total_, outcome.loss, outcome.lr, step_seconds, units_per_step);
    if (lockstep_ && config_.eval_every > 0 && done % config_.eval_every == 0 && done != total_) {
      const Evaluation e = evaluate(plain, model_, *data_->validation, data_->validation->size(),
                                    std::max<int64_t>(config_.batch_size, 256), *group_.workers_comm());
      metrics_.write(eval_record(done, e));
    }
  }
  worker.finish();  // every worker now holds the servers' final parameters
  progress_->finish();
  train_seconds_ = seconds_since(run_start);
  result_.steps = total_;
}

WorkerStep ParameterServerRun::worker_step(ps::Worker& worker, int64_t step, Stragglers& stragglers) {
  trace::Span step_span("step", trace::category::step, {{"step", step + 1}});
  WorkerStep outcome;
  outcome.lr = learning_rate({.peak_lr = config_.lr, .warmup_steps = config_.warmup, .total_steps = total_}, step);
  const std::vector<int64_t> indices = sampler_->local_batch(step);
  const data::Batch part = data_->train->get_batch(indices);
  stragglers.begin();
  for (auto& p : parameters_) p.mutable_grad() = torch::Tensor();
  torch::Tensor local_sum;
  {
    trace::Span span("forward", trace::category::compute);
    local_sum = per_sample_loss(model_.forward(part.inputs), part.targets).sum();
  }
  if (step + 1 == config_.debug_nan_at_step && rank_ == 0) local_sum = local_sum * std::nan("");
  {
    trace::Span span("backward", trace::category::compute);
    // Note [global batch loss], with W = the number of workers.
    (local_sum * (static_cast<double>(workers_) / static_cast<double>(config_.batch_size))).backward();
  }
  stragglers.end(static_cast<int64_t>(indices.size()));
  // Its send and receive are the communicator's "comm" spans.
  outcome.push = worker.push_and_pull(outcome.lr, std::isfinite(local_sum.item<double>()));
  trace::sample_memory();

  outcome.loss = local_sum.item<double>() / static_cast<double>(indices.size());  // this worker's part
  if (lockstep_) {
    auto sum = local_sum.detach().to(torch::kFloat64).reshape({1}).clone();
    group_.workers_comm()->all_reduce(sum, ReduceOp::Sum)->wait();
    outcome.loss = sum.item<double>() / static_cast<double>(config_.batch_size);
  }
  return outcome;
}

// The step's non-finite rule: a skipped update is counted and said; without
// --on-nonfinite skip a non-finite loss ends the run. (With it, a late
// ps-sync push whose loss was not finite was dropped, not applied.)
void ParameterServerRun::after_worker_step(int64_t done, const WorkerStep& outcome) {
  if (outcome.push.skipped) {
    ++result_.skipped_steps;
    if (printing_)
      progress_->message("step " + std::to_string(done) + " skipped: the loss is " + std::to_string(outcome.loss) +
                         (std::isfinite(outcome.push.grad_norm) ? "" : ", the gradient norm " + std::to_string(outcome.push.grad_norm)));
  } else if (!std::isfinite(outcome.loss) && config_.on_nonfinite != "skip") {
    throw std::runtime_error("the loss is " + std::to_string(outcome.loss) + " at step " + std::to_string(done) +
                             ": training diverged; try a lower --lr, more --warmup or --grad-clip, or --on-nonfinite skip");
  }
}

void ParameterServerRun::evaluate_at_end() {
  const int64_t eval_count = model_.classification ? data_->validation->size()
                                                   : std::min(data_->validation->size(), config_.eval_windows);
  PlainForward plain(model_);
  final_eval_ = evaluate(plain, model_, *data_->validation, eval_count, std::max<int64_t>(config_.batch_size, 256),
                         *group_.workers_comm());
  metrics_.write(eval_record(total_, *final_eval_));
}

// Every rank's peak memory and RSS, servers included.
void ParameterServerRun::gather_memory() {
  auto stats = torch::zeros({3 * world_size_}, torch::kFloat64);
  stats[rank_] = static_cast<double>(training_bytes());
  stats[world_size_ + rank_] = static_cast<double>(memory::peak_rss_bytes());
  stats[2 * world_size_ + rank_] = static_cast<double>(start_bytes_);
  world_->all_reduce(stats, ReduceOp::Sum)->wait();
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
