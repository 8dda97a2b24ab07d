// How a model is spread over the ranks (--strategy): the one place that
// wraps a model for a data-parallel engine. The trainer sees only Strategy.
//
// What each strategy name means and supports is its row in the strategy
// table (include/dtrain/strategy_table.h); wrap_model() builds its engine.
#pragma once

#include "dtrain/checkpoint.h"
#include "dtrain/comm.h"
#include "dtrain/fsdp.h"
#include "train/model.h"

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::train {

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string name() const = 0;

  // Runs the model on this rank's inputs through the engine (DDP: rank 0's
  // buffers first). Every rank calls it the same number of times, in
  // training and in evaluation, since engines may communicate in forward.
  virtual torch::Tensor forward(const torch::Tensor& inputs) = 0;

  // What this rank's optimizer updates: the whole model (single, ddp) or
  // this rank's shards (sharded strategies). Call after wrap_model().
  virtual std::vector<torch::Tensor> optimizer_parameters() = 0;

  // After backward: clips the global gradient norm to max_norm and returns
  // the norm before clipping.
  virtual double clip_grad_norm(double max_norm) = 0;

  // Applies the optimizer's update (sharded strategies: then make the
  // updated parameters whole again where they need to be).
  virtual void optimizer_step(torch::optim::Optimizer& optimizer) { optimizer.step(); }

  // --pp: bracket a step's microbatches (whose forwards and backwards
  // interleave). The sharded strategies gather every unit once before and
  // reduce the accumulated gradients once after (FullyShardedBase::
  // gather_for_step); the others need nothing.
  virtual void begin_microbatches() {}
  virtual void end_microbatches() {}

  // Runs one microbatch's backward (--pp: several per step, the last with
  // `last_in_step`); engines that reduce gradients in backward do so only in
  // the last (DDP's no_sync for the others).
  virtual void run_backward(bool last_in_step, const std::function<void()>& backward) {
    (void)last_in_step;
    backward();
  }

  // The tensor the optimizer updates for parameter `name` on this rank (the
  // module's parameter; the sharded strategies: its shard). Undefined when
  // this rank holds none of it.
  virtual torch::Tensor updated_tensor(const std::string& name) = 0;

  // Seconds the last backward spent waiting for other ranks (ddp: the end
  // of backward waiting on its buckets; 0 where unknown). --slow-rank and
  // --balance subtract it to time this rank's own compute.
  virtual double last_backward_wait_s() const { return 0; }
  // FSDP strategies: what prefetch tuning chose (TrainResult::fsdp_prefetch).
  virtual std::optional<FSDPPrefetchTuning> prefetch_tuning() const { return std::nullopt; }

  // Collective: a sharded checkpoint of the model and `optimizer` at `step`
  // in `dir` (dtrain::save_checkpoint), and loading one saved by any
  // strategy at any world size (dtrain::load_checkpoint).
  virtual void save(const std::string& dir, torch::optim::Optimizer& optimizer, int64_t step,
                    const std::map<std::string, std::string>& extra) = 0;
  virtual CheckpointManifest load(const std::string& dir, torch::optim::Optimizer& optimizer) = 0;
  // What save() writes from this rank, as the view save and load share
  // (--checkpoint-async stages it and writes it in the background).
  virtual HeldModel held() = 0;

  // --init-from: the weights of a safetensors file (sharded strategies read
  // only this rank's pieces of it). Throws std::invalid_argument
  // "--init-from: ..." for a file that does not fit the model.
  virtual void load_initial_weights(const std::string& path) = 0;
};

struct StrategyOptions {
  std::string name = "single";
  std::string compress = "none";         // ddp: a comm hook (dtrain::hooks::by_name)
  std::string mixed_precision = "none";  // none | bf16 (compute in bf16, fp32 master weights)
  std::string reduce_dtype = "fp32";     // with bf16: the gradient reduction's dtype, fp32 | bf16
  std::string fsdp_prefetch = "auto";    // zero1 / zero2 / fsdp / hsdp: on | off | auto
  std::string fsdp_compress = "none";    // sharded: dtrain::parse_collective_compression
  bool activation_checkpointing = false; // sharded: FSDPOptions::activation_checkpointing
  bool gather_per_microbatch = false;    // --pp-gather microbatch (sharded): FullyShardedBase::gather_for_step
  // Where the model trains (--device); unset: where it was built. single
  // and ddp move the module there before wrapping it; the sharded
  // strategies move each piece of their shards (FSDPOptions::device).
  std::optional<torch::Device> device{};
  bool comm_streams = true;  // --comm-streams: FSDPOptions/DDPOptions::comm_streams
  // --schedule interleaved: the step's last backward (the one DDP reduces
  // in) runs through one of the rank's chunks, so DDP takes the other
  // chunks' parameters, whose gradients accumulated under no_sync, as
  // unused in it (DDPOptions::find_unused_parameters: one small all-reduce
  // more per step) and reduces what they accumulated.
  bool chunked_stage = false;
  // --fp8 tensorwise, --fp8-all-gather on: FSDPOptions::float8_all_gather.
  bool float8_all_gather = false;
};

// --mixed-precision / --reduce-dtype as the engines' policy (DDP and FSDP alike).
MixedPrecision mixed_precision_of(const StrategyOptions& options);

// zero1 / zero2 / fsdp / hsdp as the FSDPOptions wrap_model uses on
// `world_size` ranks (also what `dtrain plan` is asked about at the end of a run).
FSDPOptions fsdp_options(const StrategyOptions& options, int world_size);

// Wraps `model` for options.name over `world`. Every rank calls it with the
// same model (same seed). Throws std::invalid_argument for a strategy this
// build cannot run.
std::unique_ptr<Strategy> wrap_model(Model& model, const StrategyOptions& options, CommPtr world);

// Throws std::invalid_argument when `options` cannot train on `world_size`
// ranks: an unknown or not yet available strategy, single on more than one
// rank, compression or mixed precision the strategy does not support.
void check_strategy(const StrategyOptions& options, int world_size);

}  // namespace dtrain::train
