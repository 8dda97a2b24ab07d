// One FSDP unit: a module's parameters as a FlatParameter, the collectives
// that gather them and reduce their gradients, and the unit's state.
//
// Note [FSDP units]
// - Units are chosen by the wrap policy (wrap_policy.h); the root unit owns
//   every parameter outside the others. A unit runs only through a call site
//   FSDP controls (Sharded<>, a root Sequential's child, the root call),
//   which brackets the module's forward with before_forward/after_forward.
// - Forward: before_forward gathers the flat parameters (all-gather into the
//   full buffer) and points every parameter at its full view; after_forward
//   registers a hook on the outputs (fires before the unit's backward) and,
//   under Sharding::Full, frees the full buffer and points parameters back
//   at their shards.
// - Backward: the output hook (pre_backward) gathers again and points the
//   parameters at their full views, so AccumulateGrad sees full shapes. Each
//   parameter's post-accumulate-grad hook counts in; after the last one the
//   unit copies the gradients into one flat buffer and starts a
//   reduce-scatter (all-reduce for OptimizerOnly) and frees its full
//   parameters. Before starting a reduction, backward waits for the oldest
//   while max_inflight_reductions are outstanding and frees that unit's
//   flat gradient buffer, which bounds the full-size gradient buffers alive
//   at once (and frees them at the same moment in every run). The root's end-of-backward
//   callback (FSDPState::finalize) waits for every reduction in issue order
//   and writes each shard's gradient to .grad of the shard-shaped parameters.
// - Every hook checks the unit's TrainingState, so a hook that fires at the
//   wrong moment (a unit used without being entered) is an error naming the
//   unit, never silent corruption.
// - All collectives are issued at points that every rank reaches in the same
//   order (forward calls, autograd hooks, the end-of-backward callback);
//   prefetch decisions depend only on that order, never on timing.
#pragma once

#include "comm/comm_stream.h"
#include "fsdp/flat_parameter.h"
#include "fsdp/float8_gather.h"
#include "fsdp/schedule_rules.h"

#include <dtrain/comm.h>
#include <dtrain/fsdp.h>

#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::detail {

enum class TrainingState { Idle, Forward, ForwardDone, PreBackward, PostBackward };
const char* to_string(TrainingState state);

// The streams a unit's collectives are issued from (FSDPState owns them; every
// unit shares them, so gathers run one after another in issue order).
// Inactive streams: the compute stream (Note [communication streams]).
struct UnitStreams {
  const CommStream* gather = nullptr;
  const CommStream* reduce = nullptr;
};

struct UnitGroups {
  Communicator* shard = nullptr;      // parameters are sharded over this group
  Communicator* replicate = nullptr;  // gradients are then averaged over this one (Hybrid, None)
};

class Unit {
 public:
  Unit(std::string name, const torch::nn::Module* module, std::vector<std::string> parameter_names,
       std::vector<torch::Tensor> parameters, UnitGroups groups, const FSDPOptions& options);
  ~Unit();  // drops its gathered fp8 weights from dtrain::linear's view
  Unit(const Unit&) = delete;
  Unit& operator=(const Unit&) = delete;

  const std::string& name() const { return name_; }
  std::string display_name() const { return name_.empty() ? "(root)" : "'" + name_ + "'"; }
  const torch::nn::Module* module() const { return module_; }
  FlatParameter& flat() { return flat_; }
  const FlatParameter& flat() const { return flat_; }
  TrainingState state() const { return state_; }

  // The state changes a step makes, named, each checked against the state
  // it leaves (std::logic_error naming the unit and both states): the rules
  // live with the state, so FSDPState cannot set an arbitrary one. FSDPState
  // still checks first the misuses a user can cause (a unit called twice,
  // a second backward), with messages that say what to change.
  void begin_forward();   // idle -> forward (forward_root, forward_unit)
  void end_forward();     // forward -> after forward (its output is hooked next)
  void begin_backward();  // after forward -> backward (pre_backward, parameters gathered)
  void end_backward();    // backward -> after its backward (its last gradient arrived)
  // Back to idle from any state: at the start of each root forward and when
  // backward ends (also after an exception), whatever a unit reached.
  void reset_to_idle() { state_ = TrainingState::Idle; }

  // Issues the all-gather if the full parameters are not gathered or on the
  // way. Returns whether it issued one.
  bool start_unshard();
  // Waits for the gather and points parameters at their full views.
  void finish_unshard();
  bool unshard_in_flight() const { return static_cast<bool>(gather_work_); }
  // Points parameters at their shards; frees the full buffer unless the
  // strategy keeps it (OptimizerOnly, one-rank groups).
  void reshard(bool free_full);

  // Post-accumulate-grad of parameter i. Returns true when it was the last
  // gradient the unit waited for.
  bool on_gradient_ready(size_t parameter);
  // Moves any existing shard-shaped .grad aside before backward, so
  // AccumulateGrad sees an empty full-shaped slot.
  void stash_shard_gradients();
  // Copies the (full) gradients into the flat buffer and starts reducing
  // it; a parameter without gradient contributes zeros. With sync false,
  // adds them to the local accumulation instead (no_sync).
  void reduce_gradients(bool sync);
  bool reduction_pending() const { return reduction_started_; }
  // Blocks until the reduction has run and frees the full-size buffer
  // (OptimizerOnly keeps it); finish_gradients() still sets .grad later.
  void wait_reduction();
  // Waits for the reduction and sets .grad of every (shard-shaped)
  // parameter, adding what was stashed.
  void finish_gradients();

  int64_t expected_gradients() const { return expected_gradients_; }

  // Note [float8 all-gather]: per entry, whether dtrain::linear took its
  // gathered view in fp8 (and the unit can gather it as fp8); then, with the
  // ranks' agreement, gather those as fp8 from now on.
  std::vector<char> float8_candidates() const;
  void gather_as_float8(const std::vector<char>& agreed);
  // The gathered fp8 weights' local amax (float32, one per weight; empty
  // without them), and their scales from the amax over the ranks.
  torch::Tensor float8_local_amax() const;
  void set_float8_amax(const torch::Tensor& amax);

  // Issue collectives from these streams from now on (before the first step).
  void use_streams(UnitStreams streams) { streams_ = streams; }
  // Before the unit goes (FSDPState's destructor, possibly after an error
  // mid-step): the compute stream waits for any gather or reduction still in
  // flight, so that no buffer is freed and reused while one writes into it.
  void settle_in_flight() noexcept;

  // Where the unit counts the bytes it hands to collectives (FSDPState's
  // running step); nullptr: not counted.
  void count_bytes_in(FSDPStepStats* stats) { stats_ = stats; }
  // This unit's compression (FSDPOptions::compression, or its override).
  const CollectiveCompression& compression() const { return compression_; }

  // The unit's place in FSDPState::units() (0: the root), for traces.
  int index() const { return index_; }
  void set_index(int index) { index_ = index; }
  // Its name in trace events (Note [trace names] in dtrain/trace.h).
  const char* trace_name() const { return trace_name_; }
  // When its backward began (trace::now_ns()), or -1 when not traced.
  int64_t backward_started_ns = -1;

 private:
  std::string name_;
  int index_ = 0;
  const char* trace_name_ = nullptr;
  const torch::nn::Module* module_;
  FlatParameter flat_;
  UnitGroups groups_;
  FSDPOptions options_;
  TrainingState state_ = TrainingState::Idle;
  void transition(TrainingState from, TrainingState to);

  // Compressed collectives: the formats actually sent (Plain when not
  // compressed, or in a one-rank group) and the records in flight.
  CollectiveCompression compression_;
  fsdp_rules::WireFormat param_format_ = fsdp_rules::WireFormat::Plain;
  fsdp_rules::WireFormat grad_format_ = fsdp_rules::WireFormat::Plain;
  torch::Tensor gathered_records_;   // every rank's encoded shard, until decoded into the full buffer
  std::optional<Float8Gather> float8_;  // Note [float8 all-gather]
  torch::Tensor float8_codes_;          // while gathered: the fp8 weights dtrain::linear multiplies
  torch::Tensor gradient_records_;   // what this rank received from the all-to-all, until summed
  FSDPStepStats* stats_ = nullptr;
  // Waits for the gather and, when compressed, decodes every rank's record
  // (this rank's included) into the full buffer.
  void complete_gather();
  // After the all-to-all: sums the received records in fp32 into shard_gradient_.
  void complete_compressed_reduction();
  // Waits for the reduction, makes the compute stream wait for it (for it
  // alone) and, when compressed, sums the records there; again after the
  // first time: nothing new.
  void settle_reduction();

  UnitStreams streams_;
  const CommStream& gather_stream() const;
  const CommStream& reduce_stream() const;

  WorkPtr gather_work_;
  torch::Tensor gather_source_;  // the shard in compute dtype (or its record), alive while gathering

  std::vector<char> ready_;
  int64_t expected_gradients_ = 0;
  int64_t ready_count_ = 0;
  std::vector<torch::Tensor> stashed_;       // shard-shaped grads from before this backward
  torch::Tensor unsynced_full_gradient_;     // no_sync accumulation, reduce dtype
  bool reduction_started_ = false;
  torch::Tensor full_gradient_;              // being reduced (OptimizerOnly: in place; compressed: the records sent)
  torch::Tensor shard_gradient_;             // reduction result (reduce dtype)
  WorkPtr reduce_work_;
};

}  // namespace dtrain::detail
