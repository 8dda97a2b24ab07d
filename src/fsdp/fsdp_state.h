// The FSDP engine for one root module: its units, their execution order,
// prefetching, and the end of backward. See Note [FSDP units] in unit.h.
#pragma once

#include "fsdp/prefetch_tuner.h"
#include "fsdp/unit.h"

#include <dtrain/deferred_init.h>
#include <dtrain/fsdp.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dtrain::detail {

class FSDPState {
 public:
  FSDPState(std::shared_ptr<torch::nn::Module> root, CommPtr comm, FSDPOptions options);
  ~FSDPState();
  FSDPState(const FSDPState&) = delete;
  FSDPState& operator=(const FSDPState&) = delete;

  // The root call: gathers the root unit, runs `forward`, hooks the output.
  torch::Tensor forward_root(const std::function<torch::Tensor()>& forward);
  // A non-root unit's call (from Sharded<> or a root Sequential).
  torch::Tensor forward_unit(Unit& unit, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                             const torch::Tensor& input);
  Unit* unit_for(const torch::nn::Module* module);

  // Note [pipeline steps]: every unit gathered once for a step of
  // interleaved microbatches (or, per_microbatch, the root once and every
  // other unit for each forward and backward that uses it), and their
  // gradients reduced once at its end.
  void gather_for_step(bool per_microbatch = false);
  void reduce_step_gradients();

  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  torch::Tensor to_compute_dtype(const torch::Tensor& input) const;

  const FSDPOptions& options() const { return options_; }
  const CommPtr& comm() const { return comm_; }
  Communicator& shard_group() const { return *shard_group_; }
  const std::shared_ptr<torch::nn::Module>& root() const { return root_; }
  std::vector<std::unique_ptr<Unit>>& units() { return units_; }  // units_[0] is the root
  const FSDPPrefetchTuning& prefetch_tuning() const { return tuner_.result(); }
  FSDPStepStats last_step() const;

 private:
  void build_groups();
  // Compression options the engine cannot honour, before anything is built.
  void check_compression() const;
  // Every unit named in compression_by_unit exists.
  void check_compression_overrides() const;
  // Units in plan_units order; `deferred` lists the modules without storage
  // yet (dtrain/deferred_init.h), materialised unit by unit.
  void build_units(const std::vector<DeferredModule>& deferred);
  void install_gradient_hooks();
  void remove_gradient_hooks();
  void hook_outputs(Unit& unit, const torch::Tensor& output);
  void pre_backward(Unit& unit);
  // Per-microbatch pipeline steps: a unit's call and its backward's start.
  torch::Tensor forward_unit_per_microbatch(Unit& unit, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                                            const torch::Tensor& input);
  void unshard_for_microbatch_backward(Unit& unit);
  void on_gradient_ready(Unit& unit, size_t parameter);
  void finalize_backward();
  // The end of a synchronised backward: this step's bytes become last_step().
  void close_step_stats();
  // Note [float8 all-gather]: before a step's first gather, which weights
  // gather as fp8 (decided once, after the first step) and their scales.
  void prepare_float8_gathers();
  bool float8_decided_ = false;
  // The end of a backward whose ranks' graphs differ: every unit some rank
  // used reduces now, in unit order.
  void reduce_in_unit_order();
  // Records the unit's "unit_backward" span, if its backward was traced.
  void end_backward_span(Unit& unit);
  // Waits for the oldest reductions while max_inflight_reductions are outstanding.
  void bound_inflight_reductions();
  void prefetch(Unit* unit);
  Unit* neighbour_in_order(const Unit& unit, int direction) const;
  bool reshard_after_forward(const Unit& unit) const;
  bool free_after_backward() const;

  std::shared_ptr<torch::nn::Module> root_;
  CommPtr comm_;
  FSDPOptions options_;
  CommPtr shard_group_, replicate_group_;
  // Note [communication streams]; inactive off CUDA or without comm_streams.
  CommStream gather_stream_;
  CommStream reduce_stream_;
  std::vector<std::unique_ptr<Unit>> units_;

  std::recursive_mutex mutex_;  // hooks may run on autograd threads
  bool sync_ = true;
  bool gathered_for_step_ = false;  // between gather_for_step and reduce_step_gradients
  bool gather_per_microbatch_ = false;
  std::vector<int64_t> step_arrivals_;  // per unit: gradients arrived in its current backward (per microbatch)
  bool in_root_forward_ = false;
  bool finalize_queued_ = false;
  std::vector<Unit*> forward_order_;       // recorded in the first forward
  bool order_recorded_ = false;
  std::vector<Unit*> this_forward_;
  // The innermost unit entered through FSDP whose forward raised, if any: the
  // root's "units not entered" hint is for failures outside every entered unit.
  Unit* failed_in_unit_ = nullptr;
  // This step's backward: reduce as units complete, or (ranks' graphs
  // differ) all at the end in unit order. Note [reduction order].
  bool eager_reductions_ = true;
  std::vector<char> used_anywhere_;
  std::vector<Unit*> reduce_order_;        // units whose reduction started, in issue order
  size_t reductions_waited_ = 0;           // reduce_order_[0 .. this) have finished
  int inflight_gathers_ = 0;
  PrefetchTuner tuner_;
  bool prefetching_ = true;  // this step's choice (tuner_); options_ say which prefetches exist
  // Bytes handed to collectives: this step's so far, and the last completed one's.
  FSDPStepStats running_step_;
  FSDPStepStats last_step_;
  mutable std::mutex stats_mutex_;  // last_step() may be read from any thread
};

// The engine and unit registered for `module` ({nullptr, nullptr} if none).
std::pair<FSDPState*, Unit*> lookup_unit(const torch::nn::Module* module);

}  // namespace dtrain::detail
