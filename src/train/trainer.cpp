// dtrain::Trainer (include/dtrain/trainer.h) and run_training (include/dtrain/train.h): the training
// loop every rank runs.
//
// Note [global batch loss]
// Step s's global batch holds B samples; rank r of W computes a contiguous
// part of b_r of them (data::DistributedSampler). Let S_r be the sum of rank
// r's per-sample losses. Each rank backpropagates S_r * W / B, which is its
// mean loss scaled by b_r * W / B. DDP averages gradients over the W ranks, so
// every rank ends with the gradient of (1/W) * sum_r S_r * W / B
// = sum_r S_r / B: the gradient of the global batch's mean loss, exactly what
// one process computes on all B samples (W = 1: S / B), however unevenly B
// splits. The loss reported is all_reduce(Sum, S_r) / B, the same number on
// every rank. A strategy must keep this contract: after backward, each rank's
// gradients (or gradient shards) are the average over ranks of what each
// rank's backward produced.
// With --cp N, the N ranks of a sequence shard share a part, and S_r is the
// sum over its samples of the mean loss over their tokens on this rank's
// shard; the part's per-sample loss is the mean of those over cp (equal
// shards). The engine averages over dp x cp, so the gradient is
// (1/(W N)) * sum S_r * W / B = sum_parts (1/N) sum_cp S_r / B, the same
// global mean; the loss reported weighs each shard's S_r by 1/N (loss_share_).
#include "dtrain/float8.h"
#include "dtrain/tokenizer.h"
#include "dtrain/train.h"
#include "dtrain/trainer.h"

#include "dtrain/context_parallel.h"
#include "dtrain/data.h"
#include "dtrain/mesh.h"
#include "dtrain/memory.h"
#include "dtrain/pipeline.h"
#include "dtrain/sync_batch_norm.h"
#include "dtrain/trace.h"
#include "train/background_checkpoints.h"
#include "train/checkpointing.h"
#include "train/cuda_runtime.h"
#include "train/device.h"
#include "train/evaluate.h"
#include "train/initial_weights.h"
#include "train/late_scalar.h"
#include "train/lr_schedule.h"
#include "train/memory_summary.h"
#include "train/metrics.h"
#include "train/model.h"
#include "train/optimizer.h"
#include "train/peak_flops.h"
#include "train/progress.h"
#include "train/run_checkpoints.h"
#include "train/ps_training.h"
#include "train/run_report.h"
#include "train/sample_log.h"
#include "train/samples.h"
#include "train/stop_signals.h"
#include "train/step_loop.h"
#include "train/stragglers.h"
#include "train/strategy.h"
#include "train/training_data.h"
#include "common/device_spans.h"
#include "common/timing.h"

#include <ATen/Parallel.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dtrain {
namespace {

// The compute dtype: whose GEMM peak MFU divides by, and what crosses a
// pipeline's stage boundaries (Note [stage dtype] in dtrain/pipeline.h).
torch::ScalarType compute_dtype(const TrainConfig& config) {
  return config.mixed_precision == "bf16" ? torch::kBFloat16 : torch::kFloat32;
}

// A pipeline's last stage scores its output in fp32, as the engines hand a
// whole model's output to the loss (FSDP's and DDP's output_dtype): its
// FSDP root runs once per step, so its per-microbatch outputs stay in the
// compute dtype, and a loss from bf16 logits was 0.007 off one process's.
torch::Tensor in_fp32(const torch::Tensor& output) {
  return output.is_floating_point() ? output.to(torch::kFloat) : output;
}

// MFU's denominator: rank 0 finds its device's peak for the compute dtype
// (--peak-tflops, the machine's cache or a GEMM probe) while the others
// wait, so that no probe competes with another rank for the device; every
// rank's share counts (ranks sharing a GPU share its peak). It runs before
// the tracking allocator starts counting: the probe's matrices are no part
// of any peak.
train::PeakFlops job_peak_flops(const TrainConfig& config, const torch::Device& device, const CommPtr& world) {
  auto peak = torch::zeros({1}, torch::kFloat64);
  std::string source;
  if (world->rank() == 0) {
    const train::PeakFlops measured = train::peak_flops(config, device, compute_dtype(config));
    peak[0] = measured.flops;
    source = measured.source;
  }
  world->blocking().broadcast(peak, 0);
  return {peak[0].item<double>() * train::devices_in_job(device, world->size()), source};
}

// One data-parallel run on this rank (single, ddp and the sharded
// strategies): set up in the constructor, then run() steps through the
// shared StepLoop (this class is its StepSource), evaluates and reports.
class DataParallelRun final : public train::StepSource {
 public:
  DataParallelRun(const TrainConfig& config, CommPtr world);
  TrainResult run();

  // train::StepSource
  int64_t next_step() const override { return next_step_; }
  train::StepOutcome run_step(int64_t step) override;
  Communicator* lockstep_ranks() override { return world_.get(); }
  void resplit(const std::vector<int64_t>& sizes) override { make_sampler(sizes); }
  void save_checkpoint(int64_t step) override;
  train::Evaluation evaluate() override;
  double settle_loss() override;

 private:
  void make_sampler(std::vector<int64_t> local_batch_sizes);
  torch::Tensor forward_and_backward(int64_t step, const data::Batch& part);
  double take_pending_loss_sum();
  double pipeline_forward_and_backward(int64_t step, const data::Batch& part);
  // --pp: the strategy's forward through the rank's chunk `chunk` (0 but
  // under --schedule interleaved).
  torch::Tensor chunk_forward(int chunk, const torch::Tensor& x);
  std::vector<int64_t> activation_shape(int64_t samples) const;
  data::Batch on_my_tokens(data::Batch batch) const;
  void build();
  void print_banner() const;
  int64_t resume();
  void measure_start_peak();
  std::vector<int64_t> device_peaks() const;
  void finish(double train_seconds);
  void print_summary(double train_seconds) const;

  const TrainConfig& config_;
  CommPtr world_;
  const int world_size_, rank_;
  // --tp, --pp, --cp: the (dp, pp, cp, tp) mesh. The ranks of one dp index
  // (its stages, sequence shards and tensor-parallel slices) share a batch
  // part and compute one loss; data and the loss's divisor are the dp
  // group's (without a mesh: the world), the strategy runs over dp x cp.
  std::optional<DeviceMesh> mesh_;
  CommPtr data_world_;
  const int dp_size_, dp_rank_;
  const bool part_leader_;  // the first rank of its dp index: logs and counts its part's loss once
  // What this rank's part loss counts in the global sum: 1 on the part
  // leader; under --cp, 1/cp on each cp rank of the first stage and tp slice
  // (each holds the mean over its shard of the part's sequences); else 0.
  const double loss_share_;
  CommPtr engine_world_;  // what --strategy runs over: dp x cp under --cp, else data_world_
  std::optional<cp::ContextParallel> context_;  // --cp: this rank's sequence shards and ring
  std::optional<pp::Pipeline> pipeline_;  // --pp: this rank's stage's schedule
  // --pp: the tied wte as the optimizer updates it (the sharded strategies:
  // its shard) on the first and last stage, for pp::sum_tied_gradients.
  torch::Tensor tied_weight_;
  const bool printing_;
  // --device: this rank's (cpu, or cuda:LOCAL_RANK); batches move there.
  const torch::Device device_;
  const train::PeakFlops peak_flops_;  // the whole job's (every rank's share summed)
  train::TrainingData data_;
  std::optional<data::DistributedSampler> sampler_;  // rebuilt with --balance's local batch sizes
  train::Stragglers stragglers_;
  int64_t total_ = 0;
  train::MetricsWriter metrics_;
  int64_t baseline_ = 0;  // live bytes before training allocated anything
  train::Model model_;
  std::unique_ptr<train::Strategy> strategy_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  train::LRSchedule schedule_;
  int64_t eval_count_ = 0, eval_chunk_ = 0;
  double units_per_step_ = 0;

  TrainResult result_;
  torch::Tensor construction_peaks_;  // per rank
  // This rank's part's loss of the steps not yet read: at most the previous
  // step's and this one's (Note [the loss one step late]).
  std::deque<train::LateScalar> pending_loss_sum_;
  std::string step_advice_;
  std::vector<int64_t> peaks_;  // per rank, the steps' peak so far
  // On a GPU: the CUDA caching allocator's peaks per rank (allocated,
  // reserved) over the steps; the progress line's "peak mem" is allocated.
  std::vector<int64_t> cuda_allocated_, cuda_reserved_;
  std::optional<train::StepLoop> loop_;
  int64_t next_step_ = 0;
  int64_t last_saved_ = 0;
  std::optional<train::BackgroundCheckpoints> background_;  // --checkpoint-async
  int64_t steps_done_ = 0;
  std::optional<train::Evaluation> final_eval_;

  int64_t training_bytes() const { return std::max<int64_t>(0, memory::peak_bytes() - baseline_); }
};

namespace {

// DataParallelRun::loss_share_, Note [global batch loss].
double loss_share(const TrainConfig& config, const std::optional<DeviceMesh>& mesh, bool part_leader) {
  if (config.cp == 1) return part_leader ? 1.0 : 0.0;
  const auto coordinate = [&](const char* name) { return mesh->has(name) ? mesh->rank(name) : 0; };
  const bool first_stage_and_slice = coordinate("pp") == 0 && coordinate("tp") == 0;
  return first_stage_and_slice ? 1.0 / config.cp : 0.0;
}

}  // namespace

DataParallelRun::DataParallelRun(const TrainConfig& config, CommPtr world)
    : config_(config),
      world_(std::move(world)),
      world_size_(world_->size()),
      rank_(world_->rank()),
      mesh_(train::make_mesh(config, world_)),
      data_world_(mesh_ ? mesh_->comm("dp") : world_),
      dp_size_(data_world_->size()),
      dp_rank_(data_world_->rank()),
      part_leader_(rank_ % (config.pp * config.cp * config.tp) == 0),  // dp is the outermost dimension
      loss_share_(loss_share(config, mesh_, part_leader_)),
      engine_world_(config.cp > 1 ? mesh_->comm("dp_cp") : data_world_),
      printing_(config.print && rank_ == 0),
      device_(train::resolve_device(config)),
      peak_flops_((train::prepare_device(config, device_), job_peak_flops(config, device_, world_))),
      data_((memory::install_tracking_allocator(), train::load_training_data(config))),
      stragglers_(config, rank_, rank_, world_size_) {  // --slow-rank, --balance
  make_sampler({});
  total_ = config_.steps > 0 ? config_.steps : sampler_->steps_for_epochs(config_.epochs);
  // Created once the data is known to fit, so a bad run leaves an old file alone.
  // A resumed run appends to the metrics file of the run it continues.
  if (rank_ == 0 && !config_.metrics_path.empty()) metrics_ = train::MetricsWriter(config_.metrics_path, config_.resume);
  // The peak counts what training allocates (model, gradients, optimizer
  // state, activations, communication buffers), not the datasets.
  baseline_ = memory::live_bytes();
  memory::reset_peak();
  build();
  schedule_ = {.peak_lr = config_.lr, .warmup_steps = config_.warmup, .total_steps = total_};
  units_per_step_ = static_cast<double>(config_.batch_size * data_.units_per_sample);
  // Token windows overlap a corpus's split in many ways: --eval-windows of them.
  eval_count_ = model_.token_sequences ? std::min(data_.validation->size(), config_.eval_windows)
                                       : data_.validation->size();
  // Evaluation batches about as large as training's, so the peak memory stays
  // training's (at least 256 images, so tiny batches do not take thousands of calls).
  eval_chunk_ = model_.token_sequences ? config_.batch_size : std::max<int64_t>(config_.batch_size, 256);
}

void DataParallelRun::make_sampler(std::vector<int64_t> local_batch_sizes) {
  sampler_.emplace(train::sampler_options(config_, data_, dp_size_, dp_rank_, std::move(local_batch_sizes)));
}

// Construction: the sharded strategies build the model deferred and
// materialise each unit straight into this rank's shards, so no rank holds
// the whole model (dtrain/deferred_init.h); single and ddp hold a replica.
void DataParallelRun::build() {
  const bool deferred = train::builds_deferred(config_.strategy);
  memory::set_phase("construction of the model", train::construction_advice(config_, world_size_));
  torch::manual_seed(config_.seed);  // the same weights on every rank
  if (config_.pp > 1) {
    model_ = train::build_stage(config_, *mesh_, deferred);
    pipeline_.emplace(mesh_->comm("pp"), pp::schedule_from(config_.schedule), config_.microbatches,
                      config_.virtual_stages);
  } else {
    model_ = train::build_model(config_, deferred, config_.tp > 1 ? mesh_->comm("tp") : nullptr);
  }
  if (mesh_) model_.mesh = &*mesh_;
  if (config_.cp > 1) context_.emplace(mesh_->comm("cp"), config_.cp_overlap);
  // A model's SyncBatchNorm layers take their statistics over the global
  // batch: every data-parallel rank's part (dtrain/sync_batch_norm.h).
  set_sync_batch_norm_comm(*model_.module, engine_world_);
  strategy_ = train::wrap_model(
      model_, {.name = config_.strategy, .compress = config_.compress, .mixed_precision = config_.mixed_precision,
               .reduce_dtype = config_.reduce_dtype,
               .fsdp_prefetch = config_.fsdp_prefetch, .fsdp_compress = config_.fsdp_compress,
               .activation_checkpointing = config_.activation_checkpointing,
               .gather_per_microbatch = config_.pp_gather == "microbatch",
               .device = device_.is_cuda() ? std::optional<torch::Device>(device_) : std::nullopt,
               .comm_streams = config_.comm_streams,
               .chunked_stage = config_.virtual_stages > 1,
               .float8_all_gather = config_.fp8 == "tensorwise" && config_.fp8_all_gather},
      engine_world_);
  if (pipeline_ && !model_.tied_weight.empty()) tied_weight_ = strategy_->updated_tensor(model_.tied_weight);
  if (!config_.init_from.empty()) {
    memory::set_phase("load of --init-from " + config_.init_from);
    strategy_->load_initial_weights(config_.init_from);
  }
  // Dropout then draws different masks on each data-parallel rank, as on
  // different samples; the ranks of a tp group alike, since they compute
  // the same replicated activations.
  torch::manual_seed(config_.seed + 1 + static_cast<uint64_t>(dp_rank_));
  optimizer_ = train::make_optimizer(
      strategy_->optimizer_parameters(),
      {.name = config_.optimizer, .lr = config_.lr, .momentum = config_.momentum, .weight_decay = config_.weight_decay});
}

void DataParallelRun::print_banner() const {
  if (!printing_) return;
  const TrainConfig& c = config_;
  std::cout << "dtrain train: " << train::describe_model(c) << ", " << train::format_parameters(model_.parameters)
            << " parameters" << (c.init_from.empty() ? "" : ", initial weights from " + c.init_from) << "\n"
            << "  data      " << data_.description << "\n"
            << "  strategy  " << c.strategy << (c.compress != "none" ? " (" + c.compress + " compression)" : "")
            << (c.activation_checkpointing ? " with activation checkpointing" : "")
            << " on " << world_size_ << (world_size_ == 1 ? " rank" : " ranks")
            << (mesh_ ? ", mesh " + mesh_->describe() : std::string()) << " (" << world_->backend_name() << "), " << at::get_num_threads() << (at::get_num_threads() == 1 ? " thread" : " threads")
            << " per rank\n";
  if (!c.parallel_auto.empty())
    std::cout << "  layout    chosen by --parallel auto: " << c.parallel_auto << " (predicted "
              << c.parallel_auto_predicted_step_s * 1e3 << " ms per step)\n";
  std::cout << "  device    " << train::describe_device(device_)
            << (c.mixed_precision == "bf16" ? ", bf16 compute (fp32 master weights, " + c.reduce_dtype + " reduction)"
                                            : std::string(device_.is_cuda() && c.tf32 ? ", fp32 (TF32 matmuls)" : ", fp32"))
            << (c.fp8 != "off" ? ", fp8 " + c.fp8 + " linear layers of K N / (K + N) >= " +
                                     std::to_string(c.fp8_min_width)
                               : std::string())
            << "\n"
            << "  schedule  " << total_ << " steps of " << c.batch_size << " samples";
  if (c.epochs > 0) std::cout << " (" << c.epochs << (c.epochs == 1 ? " epoch" : " epochs") << ")";
  std::cout << ", " << c.optimizer << " lr " << c.lr;
  if (c.warmup > 0) std::cout << ", " << c.warmup << " warmup steps";
  std::cout << ", cosine decay to " << c.lr * schedule_.final_fraction << std::endl;
}

// Continue where the newest checkpoint left off: weights, optimizer state,
// this rank's random state; the step says where the sampler and the
// learning-rate schedule are. Returns the first step to run.
int64_t DataParallelRun::resume() {
  return train::resume_run(
      config_, total_, [&](const std::string& path) { return strategy_->load(path, *optimizer_); }, world_, printing_,
      metrics_, result_);
}

// Everything up to here (construction, --init-from, --resume) is the start's
// peak; the steps' peak is measured from here on.
void DataParallelRun::measure_start_peak() {
  construction_peaks_ = torch::zeros({world_size_}, torch::kFloat64);
  construction_peaks_[rank_] = static_cast<double>(training_bytes());
  world_->blocking().all_reduce(construction_peaks_, ReduceOp::Sum);
  memory::reset_peak();
  if (device_.is_cuda()) train::cuda::reset_memory_peaks(device_.index());
  step_advice_ = train::step_advice(config_);
}

// This rank's peaks since the last reset: host bytes the tracking allocator
// saw, then (on a GPU) the caching allocator's allocated and reserved bytes.
std::vector<int64_t> DataParallelRun::device_peaks() const {
  const auto cuda_peaks = device_.is_cuda() ? train::cuda::memory_peaks(device_.index()) : train::cuda::MemoryPeaks{};
  return {training_bytes(), cuda_peaks.allocated, cuda_peaks.reserved};
}

// Forward, backward, clipping and the update of one step, then one small
// all-reduce: the global loss, every rank's peak memory, and whether a rank
// was asked to stop (SIGINT/SIGTERM; see stop_signals.h).
train::StepOutcome DataParallelRun::run_step(int64_t step) {
  next_step_ = step + 1;
  train::StepOutcome outcome;
  outcome.lr = train::learning_rate(schedule_, step);
  train::set_learning_rate(*optimizer_, outcome.lr);
  const std::vector<int64_t> local_indices = sampler_->local_batch(step);
  if (part_leader_)  // DTRAIN_TEST_SAMPLE_LOG: one record per batch part
    train::log_samples(dp_size_, dp_rank_, step, sampler_->options().dataset_size,
                       sampler_->options().global_batch_size, local_indices);
  const data::Batch part = on_my_tokens(train::batch_on(data_.train->get_batch(local_indices), device_));
  // --cp: the models' positions and attention are this rank's shard's from
  // here through backward (and a recompute in it) and clipping.
  std::optional<cp::ContextParallel::Scope> on_shards;
  if (context_) on_shards.emplace(*context_);
  stragglers_.begin();
  optimizer_->zero_grad();
  // The part's loss: under --pp the pipeline has it on the host already;
  // otherwise it stays on the device and is read a step late unless
  // --on-nonfinite skip must see it before the update (Note [the loss one
  // step late], late_scalar.h).
  const bool loss_late = !pipeline_ && config_.on_nonfinite != "skip";
  double local_sum = 0;
  if (pipeline_) {
    local_sum = pipeline_forward_and_backward(step, part);
  } else if (const torch::Tensor on_device = forward_and_backward(step, part); loss_late) {
    pending_loss_sum_.emplace_back(on_device);  // the copy starts behind the backward
  } else {
    local_sum = on_device.item<double>();
  }
  stragglers_.end(static_cast<int64_t>(local_indices.size()), strategy_->last_backward_wait_s());
  outcome.grad_norm = config_.grad_clip > 0 ? strategy_->clip_grad_norm(config_.grad_clip) : 0.0;
  // --on-nonfinite skip: agree on the loss before the update, so that every
  // rank skips the same steps (the gradient norm is already global).
  if (config_.on_nonfinite == "skip") {
    auto global_sum = torch::tensor({local_sum}, torch::kFloat64);
    world_->blocking().all_reduce(global_sum, ReduceOp::Sum);
    outcome.skipped = !std::isfinite(global_sum.item<double>()) || !std::isfinite(outcome.grad_norm);
  }
  if (!outcome.skipped) {
    memory::set_phase("optimizer step");
    trace::Span span("optimizer_step", trace::category::compute);
    const trace::DeviceSpan on_device("optimizer_step", trace::category::device_compute, trace::kComputeLane,
                                      trace::current_stream_of(device_));
    strategy_->optimizer_step(*optimizer_);
  }
  trace::sample_memory();

  // The previous step's loss rides along when this one's is late: reading it
  // waits for that step's copy only, not for this step's queued work.
  const bool previous_late = loss_late && pending_loss_sum_.size() == 2;
  if (previous_late) local_sum = take_pending_loss_sum();
  auto stats = torch::zeros({2 + 3 * world_size_}, torch::kFloat64);
  auto values = stats.accessor<double, 1>();
  values[0] = loss_share_ * local_sum;  // the part's loss (on every rank of its dp index), once
  values[1] = static_cast<double>(train::StopSignals::received());
  const std::vector<int64_t> mine = device_peaks();
  for (int k = 0; k < 3; ++k) values[2 + k * world_size_ + rank_] = static_cast<double>(mine[static_cast<size_t>(k)]);
  world_->blocking().all_reduce(stats, ReduceOp::Sum);
  outcome.loss = values[0] / static_cast<double>(config_.batch_size);
  if (loss_late) {
    outcome.loss_late = true;
    if (previous_late) outcome.previous_loss = outcome.loss;
  }
  outcome.stop_requested = values[1] != 0;
  for (int r = 0; r < world_size_; ++r) {
    const auto at = [&](int k) { return static_cast<int64_t>(values[2 + k * world_size_ + r]); };
    peaks_[static_cast<size_t>(r)] = at(0);
    if (device_.is_cuda()) {
      cuda_allocated_[static_cast<size_t>(r)] = at(1);
      cuda_reserved_[static_cast<size_t>(r)] = at(2);
    }
  }
  outcome.peak_bytes_per_rank = device_.is_cuda() ? cuda_allocated_ : peaks_;
  if (device_.is_cuda()) outcome.device_reserved_bytes_per_rank = cuda_reserved_;
  return outcome;
}

// The oldest pending part loss, read (waiting for its copy only) and dropped.
double DataParallelRun::take_pending_loss_sum() {
  if (pending_loss_sum_.empty()) throw std::logic_error("no step's loss is pending");
  const double value = pending_loss_sum_.front().take();
  pending_loss_sum_.pop_front();
  return value;
}

// The late step's loss, now (collective over the world, as the step's stats).
double DataParallelRun::settle_loss() {
  const double local_sum = take_pending_loss_sum();
  auto sum = torch::tensor({loss_share_ * local_sum}, torch::kFloat64);
  world_->blocking().all_reduce(sum, ReduceOp::Sum);
  return sum.item<double>() / static_cast<double>(config_.batch_size);
}

// Forward and backward of this rank's part: returns the sum of its
// per-sample losses, on the device (detached).
torch::Tensor DataParallelRun::forward_and_backward(int64_t step, const data::Batch& part) {
  torch::Tensor local_sum;
  {
    memory::set_phase("forward", step_advice_);
    trace::Span span("forward", trace::category::compute);
    const trace::DeviceSpan on_device("forward", trace::category::device_compute, trace::kComputeLane,
                                      trace::current_stream_of(device_));
    local_sum = model_.loss(strategy_->forward(part.inputs), part.targets).sum();
  }
  if (step + 1 == config_.debug_nan_at_step && rank_ == 0) local_sum = local_sum * std::nan("");
  {
    memory::set_phase("backward");
    trace::Span span("backward", trace::category::compute);
    const trace::DeviceSpan on_device("backward", trace::category::device_compute, trace::kComputeLane,
                                      trace::current_stream_of(device_));
    // See Note [global batch loss].
    (local_sum * (static_cast<double>(dp_size_) / static_cast<double>(config_.batch_size))).backward();
  }
  return local_sum.detach();
}

// What a stage sends the next for `samples` windows of --seq-len (the spec's pipeline_stage says).
std::vector<int64_t> DataParallelRun::activation_shape(int64_t samples) const {
  return model_.activation_shape(samples, config_.seq_len / config_.cp);  // --cp: a shard's tokens
}

// --cp: of every sequence of the batch (inputs and targets), this rank's
// head and tail chunks; the batch itself otherwise.
data::Batch DataParallelRun::on_my_tokens(data::Batch batch) const {
  if (!context_) return batch;
  batch.inputs = context_->shard(batch.inputs, 1);
  batch.targets = context_->shard(batch.targets, 1);
  return batch;
}

torch::Tensor DataParallelRun::chunk_forward(int chunk, const torch::Tensor& x) {
  if (model_.select_chunk) model_.select_chunk(chunk);
  return strategy_->forward(x);
}

// --pp: the part's microbatches through the stages under the schedule. Each
// microbatch's loss is scaled so that the pipeline's sum over them is the
// part's share of the global batch's mean (Note [global batch loss]); the
// tied wte's two copies then take the same gradient. Returns the part's
// summed per-sample losses, on every stage.
double DataParallelRun::pipeline_forward_and_backward(int64_t step, const data::Batch& part) {
  memory::set_phase("pipeline forward and backward", step_advice_);  // the pipeline traces its own spans
  const int M = config_.microbatches;
  const double to_global_mean = static_cast<double>(dp_size_) / static_cast<double>(config_.batch_size);
  const bool poison = step + 1 == config_.debug_nan_at_step && dp_rank_ == 0;
  const auto loss = [&](const torch::Tensor& logits, const torch::Tensor& targets) {
    torch::Tensor sum = model_.loss(in_fp32(logits), targets).sum();
    if (poison) sum = sum * std::nan("");
    return sum * (to_global_mean * M);  // the pipeline divides each microbatch's loss by M
  };
  strategy_->begin_microbatches();
  const double scaled = pipeline_->step([&](int chunk, const torch::Tensor& x) { return chunk_forward(chunk, x); }, loss,
                                        part.inputs, part.targets, activation_shape(part.inputs.size(0) / M),
                                        compute_dtype(config_), [&](bool last, const std::function<void()>& backward) {
                                          strategy_->run_backward(last, backward);
                                        });
  strategy_->end_microbatches();
  if (!model_.tied_weight.empty()) pp::sum_tied_gradients(tied_weight_, *pipeline_);
  return scaled / to_global_mean;
}

train::Evaluation DataParallelRun::evaluate() {
  if (!pipeline_ && !context_) {
    return train::evaluate([&](const torch::Tensor& inputs) { return strategy_->forward(inputs); }, model_,
                           *data_.validation, eval_count_, eval_chunk_, *data_world_, device_);
  }
  std::optional<cp::ContextParallel::Scope> on_shards;  // --cp, as in a step
  if (context_) on_shards.emplace(*context_);
  const auto part_loss = [&](const data::Batch& whole) {
    const data::Batch part = on_my_tokens(whole);
    train::PartTotals totals;
    if (pipeline_) {
      totals.loss_sum = pipeline_->evaluate(
          [&](int chunk, const torch::Tensor& x) { return chunk_forward(chunk, x); },
          [&](const torch::Tensor& logits, const torch::Tensor& targets) {
            return model_.loss(in_fp32(logits), targets).sum();
          },
          part.inputs, part.targets, activation_shape(0), compute_dtype(config_));
    } else {
      totals.loss_sum = model_.loss(strategy_->forward(part.inputs), part.targets).sum().item<double>();
    }
    if (context_) {
      // Each cp rank has its shards' mean per sequence: the part's is their mean.
      auto sum = torch::tensor({totals.loss_sum}, torch::kFloat64);
      context_->group()->blocking().all_reduce(sum, ReduceOp::Sum);
      totals.loss_sum = sum.item<double>() / context_->size();
    }
    return totals;
  };
  return train::evaluate(part_loss, model_, *data_.validation, eval_count_, eval_chunk_, *data_world_, device_);
}

void DataParallelRun::save_checkpoint(int64_t step) {
  if (background_) {
    background_->save(step, strategy_->held(), optimizer_.get());
    return;
  }
  train::save_run_checkpoint(
      config_, step, total_, last_saved_,
      [&](const std::string& path, int64_t at, const std::map<std::string, std::string>& extra) {
        strategy_->save(path, *optimizer_, at, extra);
      },
      world_);
  last_saved_ = step;
}

TrainResult DataParallelRun::run() {
  print_banner();
  const int64_t first_step = resume();
  std::optional<train::StopSignals> stop_signals;
  if (!config_.checkpoint_dir.empty()) stop_signals.emplace();
  measure_start_peak();

  result_.world_size = world_size_;
  peaks_.assign(static_cast<size_t>(world_size_), 0);
  cuda_allocated_.assign(static_cast<size_t>(world_size_), 0);
  cuda_reserved_.assign(static_cast<size_t>(world_size_), 0);
  last_saved_ = first_step;
  next_step_ = first_step;
  if (config_.checkpoint_async) background_.emplace(config_, total_, first_step, world_);
  loop_.emplace(config_, total_, units_per_step_, data_.unit, printing_, metrics_, stragglers_, result_);
  loop_->set_utilization({.flops_per_unit = train::model_flops_per_unit(config_, model_.parameters),
                          .peak_flops = peak_flops_.flops});

  const auto run_start = SteadyClock::now();
  model_.module->train();
  // --trace: this rank's timeline from here to the end of the loop (dtrain/trace.h).
  if (!config_.trace_path.empty()) trace::start(rank_);
  steps_done_ = loop_->run(*this);
  // The last checkpoint (the end, or a stop signal's) is on disk before the
  // run says it is done.
  if (background_) background_->flush();
  loop_->finish();
  const double train_seconds = seconds_since(run_start);
  train::write_trace_if_asked(config_, *world_, printing_);
  finish(train_seconds);
  print_summary(train_seconds);
  return result_;
}

// End of run: evaluate on the whole validation split (the full test set for
// classification) and, for the GPT, write a few samples. A run stopped by a
// signal skips both: it is to end promptly, and it will continue. Then the
// result and the metrics file's final line.
void DataParallelRun::finish(double train_seconds) {
  const bool stopped = result_.stopped_by_signal != 0;
  if (!stopped) {
    memory::set_phase("final evaluation");
    final_eval_ = evaluate();
    metrics_.write(train::eval_record(total_, *final_eval_));
  }
  if (model_.token_sequences && !stopped && config_.samples > 0) {  // --samples 0: none (Note [no empty batches])
    std::optional<data::Tokenizer> tokenizer;
    if (!config_.tokenizer.empty()) tokenizer.emplace(config_.tokenizer);
    const ModelSpec& spec = train::model_spec(config_);
    decltype(train::SampleOptions::sampler) sampler;
    if (spec.sample)
      sampler = [&](const torch::Tensor& prompts, int64_t new_tokens, at::Generator generator,
                    const std::function<torch::Tensor(const torch::Tensor&)>& logits) {
        return spec.sample(prompts, new_tokens, config_, std::move(generator), logits);
      };
    result_.samples = train::generate_samples(
        *model_.module, config_.seq_len,
        {.count = config_.samples, .bytes = config_.sample_bytes, .prompt = config_.sample_prompt, .seed = config_.seed,
         .tokenizer = tokenizer ? &*tokenizer : nullptr, .sampler = sampler},
        [&](const torch::Tensor& tokens) {
          // Sampling draws on the host; the model runs on this rank's device.
          if (!pipeline_) return model_.full_logits(strategy_->forward(tokens.to(device_))).to(torch::kCPU);
          const int64_t n = tokens.size(0), t = tokens.size(1);
          return model_.full_logits(pipeline_->infer([&](int chunk, const torch::Tensor& x) { return chunk_forward(chunk, x); },
                                                     tokens, model_.activation_shape(n, t),
                                                     model_.output_shape(n, t), compute_dtype(config_))
                                      .to(torch::kFloat));
        });
  }
  auto rss = torch::zeros({world_size_}, torch::kFloat64);
  rss[rank_] = static_cast<double>(memory::peak_rss_bytes());
  world_->blocking().all_reduce(rss, ReduceOp::Sum);

  result_.steps = steps_done_;
  result_.loss = result_.losses.empty() ? 0 : result_.losses.back();
  if (final_eval_) {
    result_.eval_loss = final_eval_->loss;
    result_.eval_accuracy = final_eval_->accuracy;
  }
  result_.step_time_s_median = median(loop_->step_times());
  // Under --pp the sharded strategies gather each unit once per step
  // (Note [pipeline steps]): there is no prefetch to tune or report.
  if (const auto tuning = pipeline_ ? std::nullopt : strategy_->prefetch_tuning()) {
    result_.fsdp_prefetch = tuning->prefetch ? "on" : "off";
    result_.prefetch_with_s = tuning->with_prefetch_s;
    result_.prefetch_without_s = tuning->without_prefetch_s;
  }
  result_.step_peak_bytes = *std::max_element(peaks_.begin(), peaks_.end());
  for (int r = 0; r < world_size_; ++r) {
    const auto start = static_cast<int64_t>(construction_peaks_[r].item<double>());
    result_.construction_peak_bytes = std::max(result_.construction_peak_bytes, start);
    peaks_[static_cast<size_t>(r)] = std::max(peaks_[static_cast<size_t>(r)], start);
  }
  result_.peak_memory_bytes_per_rank = peaks_;
  result_.peak_memory_bytes = *std::max_element(peaks_.begin(), peaks_.end());
  result_.peak_rss_bytes = static_cast<int64_t>(rss.max().item<double>());

  nlohmann::ordered_json final_line = train::final_record(config_, result_, model_.parameters);
  final_line["local_batch_sizes"] = stragglers_.local_batch_sizes();  // --balance; [] = the even split
  final_line["train_time_s"] = train_seconds;
  final_line["mesh"] = {{"dp", dp_size_}, {"pp", config_.pp}, {"cp", config_.cp}, {"tp", config_.tp}};
  final_line["parallel"] = config_.parallel_auto.empty()
                               ? nlohmann::ordered_json("manual")
                               : nlohmann::ordered_json{{"auto", config_.parallel_auto},
                                                        {"predicted_step_s", config_.parallel_auto_predicted_step_s}};
  final_line["device"] = device_.str();
  // A peak the steps beat was measured under load (or given wrong): the next
  // run measures again rather than divide by it (Utilization::mfu).
  if (loop_->median_beat_the_peak() && rank_ == 0 && config_.peak_tflops <= 0)
    train::forget_cached_peak(config_, device_, compute_dtype(config_));
  if (const double mfu = loop_->median_mfu(); mfu > 0) {
    final_line["mfu"] = mfu;  // of the median step
    final_line["peak_tflops"] = peak_flops_.flops / 1e12;
    final_line["peak_flops_source"] = peak_flops_.source;
  }
  if (device_.is_cuda()) {
    final_line["cuda_allocated_peak_bytes"] = cuda_allocated_;
    final_line["cuda_reserved_peak_bytes"] = cuda_reserved_;
  }
  if (pipeline_)
    final_line["pipeline"] = {{"schedule", config_.schedule}, {"microbatches", config_.microbatches},
                              {"virtual_stages", config_.virtual_stages},
                              {"gather", config_.pp_gather}};
  if (background_) final_line["checkpoint_staging_bytes"] = background_->staging_bytes();  // Note [staging buffer]
  metrics_.write(final_line);
}

void DataParallelRun::print_summary(double train_seconds) const {
  if (!printing_) return;
  if (result_.stopped_by_signal != 0) {
    std::cout << train::signal_name(result_.stopped_by_signal) << ": stopped after step " << steps_done_
              << "; checkpoint saved in " << train::checkpoint_path(config_.checkpoint_dir, steps_done_)
              << " (continue with the same command and --resume)" << std::endl;
    return;
  }
  std::ostringstream text;
  text.setf(std::ios::fixed);
  if (final_eval_->accuracy) {
    text.precision(2);
    text << "test accuracy: " << 100 * *final_eval_->accuracy << "% on " << train::format_count(eval_count_)
         << " test images (loss ";
    text.precision(4);
    text << final_eval_->loss << ")\n";
  } else {
    text.precision(4);
    text << "validation loss: " << final_eval_->loss << " (" << eval_count_ << " windows of " << config_.seq_len
         << (train::tokens_path(config_.data).empty() ? " bytes)\n" : " tokens)\n");
    for (size_t i = 0; i < result_.samples.size(); ++i) {
      text << "sample " << i + 1 << ":\n";
      std::istringstream lines(train::printable(result_.samples[i]));
      for (std::string line; std::getline(lines, line);) text << "  | " << line << "\n";
    }
  }
  text.precision(3);
  text << "done: " << total_ << " steps";
  if (result_.resumed_from_step > 0) text << " (" << total_ - result_.resumed_from_step << " after resuming)";
  if (result_.skipped_steps > 0) text << ", " << result_.skipped_steps << " skipped (non-finite)";
  text << " in " << train::format_duration(train_seconds) << " (median step " << result_.step_time_s_median << " s";
  if (const double mfu = loop_->median_mfu(); mfu > 0) {
    text.precision(1);
    text << ", MFU " << 100 * mfu << "% of " << train::format_flops(peak_flops_.flops);
    text.precision(3);
  } else if (loop_->median_beat_the_peak()) {
    text << ", no MFU: the steps beat the peak of " << train::format_flops(peak_flops_.flops) << " ("
         << peak_flops_.source << "), so that peak is wrong; the next run probes again, or give --peak-tflops";
  }
  text << "); peak memory per rank " << train::per_rank_bytes(result_.peak_memory_bytes_per_rank) << ", peak RSS "
       << train::format_bytes(result_.peak_rss_bytes) << "\n";
  if (device_.is_cuda())
    text << "CUDA caching allocator per rank: peak allocated " << train::per_rank_bytes(cuda_allocated_)
         << ", peak reserved " << train::per_rank_bytes(cuda_reserved_) << "\n";
  if (auto memory = train::memory_summary(config_, world_size_, result_)) text << *memory << "\n";
  if (!result_.fsdp_prefetch.empty()) text << train::prefetch_line(config_, result_) << "\n";
  std::cout << text.str() << std::flush;
}

}  // namespace

Trainer::Trainer(TrainConfig config) : config_(std::move(config)) {}

Trainer::Trainer(TrainConfig config, ModelSpec spec) : config_(std::move(config)) {
  if (spec.name.empty())
    throw std::invalid_argument("dtrain::Trainer: the model spec needs a name (ModelSpec::name), the --model its "
                                "checkpoints and metrics record");
  if (!spec.build) throw std::invalid_argument("dtrain::Trainer: the model spec '" + spec.name + "' has no build function");
  config_.model = spec.name;
  spec_ = std::make_shared<const ModelSpec>(std::move(spec));
}

TrainResult Trainer::run(CommPtr world) const {
  if (!world) throw std::invalid_argument("run_training: the communicator is null; pass the one dtrain::init() returned");
  if (spec_) register_model(spec_->name, *spec_);  // this Trainer's spec, whatever was registered since
  TrainConfig resolved = config_;
  apply_model_config(resolved);  // a Hugging Face config.json's architecture
  check_train_config(resolved, world->size());
  // --fp8: for every forward of the run, on any thread (dtrain/float8.h).
  std::optional<Float8Scope> float8;
  if (resolved.fp8 != "off")
    float8.emplace(Float8Settings{.scaling = parse_float8_scaling(resolved.fp8), .min_width = resolved.fp8_min_width});
  // The parameter server: its servers serve, its workers run the same StepLoop (step_loop.h).
  if (train::is_parameter_server(resolved.strategy)) return train::run_parameter_server(resolved, world);
  return DataParallelRun(resolved, std::move(world)).run();
}

TrainResult run_training(const TrainConfig& config, CommPtr world) { return Trainer(config).run(std::move(world)); }

}  // namespace dtrain
