// Fully sharded data parallel (FSDP / ZeRO): parameters, gradients and
// optimizer state split across ranks; a unit's full weights exist only while
// it runs.
//
//   auto world = dtrain::init(argc, argv);
//   GPT model(cfg);                         // blocks held as dtrain::Sharded<GPTBlock>
//   auto fsdp = dtrain::fully_shard(model, world, {.strategy = dtrain::Sharding::Full});
//   torch::optim::AdamW opt(model->parameters(), ...);   // this rank's shards
//   auto loss = loss_fn(fsdp(tokens), targets);           // units gathered as they run
//   loss.backward();                                      // gradients reduce-scattered
//   dtrain::clip_grad_norm(fsdp, 1.0);
//   opt.step();                                           // each rank updates its shard
//
// How it works: Note [FSDP units] in src/fsdp/unit.h.
#pragma once

#include <dtrain/comm.h>
#include <dtrain/fsdp_compression.h>
#include <dtrain/mixed_precision.h>
#include <dtrain/sharding.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace dtrain {

enum class BackwardPrefetch {
  None,
  Pre,   // issue the next unit's all-gather before this unit's gradient computation
  Post,  // ... after it (less memory in flight, less overlap)
};

// Which submodules become units (one all-gather and one reduce-scatter
// each). A unit must be entered through a call site FSDP controls:
// dtrain::Sharded<Holder>, or a child of a root torch::nn::Sequential.
struct WrapPolicy {
  // Modules held by a dtrain::Sharded<> holder, and the children of a root
  // Sequential, are units.
  bool declared = true;
  // Also: modules whose name() is one of these (e.g. "GPTBlockImpl").
  std::vector<std::string> module_types{};
  // Also: modules owning at least this many parameters (0: off).
  int64_t min_parameters = 0;
  // Also: these modules, by qualified name ("blocks.0").
  std::vector<std::string> module_names{};
};

struct FSDPOptions {
  Sharding strategy = Sharding::Full;
  // Hybrid only: ranks per sharding group; must divide the world size.
  int hybrid_group_size = 0;
  WrapPolicy wrap{};
  MixedPrecision mixed_precision{};
  // Where the shards (and so the gathered parameters, gradients and
  // optimizer state) live; unset: the parameters' own device. A model built
  // on the host (deferred or not) moves to a GPU this way a piece at a time:
  // each rank's GPU only ever holds its shards and the units in use.
  // Buffers are not moved (move them with the module's to() after wrapping).
  std::optional<torch::Device> device{};
  bool forward_prefetch = true;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::Pre;
  // All-gathers issued ahead and not yet consumed (bounds prefetch memory).
  int max_inflight_all_gathers = 2;
  // Gradient reduce-scatters outstanding in backward. Each holds its unit's
  // full-size gradient buffer; before issuing one more, backward waits for
  // the oldest and frees its buffer, so at most this many are alive at once
  // (1: each reduction overlaps the previous unit's gradient computation).
  int max_inflight_reductions = 1;
  // Recompute each unit's forward during its backward instead of keeping
  // its activations (units with one tensor input and one tensor output).
  bool activation_checkpointing = false;
  // On a CUDA device: all-gathers on one stream of their own and gradient
  // reductions on another, ordered against the compute stream by events, so
  // a prefetched gather runs while the current unit computes (Note
  // [communication streams] in src/comm/comm_stream.h). false: every
  // collective is issued from the compute stream. No effect on the CPU.
  bool comm_streams = true;
  // When > 0 (and some prefetch is on): after two warm-up steps, training
  // steps alternate with and without prefetch, this many of each, and the
  // run keeps whichever had the shorter median step on the slowest rank
  // (Note [prefetch tuning] in src/fsdp/prefetch_tuner.h). 0: as configured.
  int prefetch_tuning_steps = 0;
  // Compressed all-gathers and reduce-scatters (ZeRO++ style; docs/fsdp.md,
  // "Compressed collectives"): every unit's, unless compression_by_unit
  // names it (by qualified name, "" for the root). Within the sharding group
  // only: a one-rank group sends nothing, and Hybrid's all-reduce across
  // groups stays uncompressed. OptimizerOnly all-reduces gradients, so it
  // takes params compression only.
  CollectiveCompression compression{};
  std::map<std::string, CollectiveCompression> compression_by_unit{};
  // Under installed --fp8 tensorwise settings (dtrain/float8.h): from the
  // second step, the weights dtrain::linear took in fp8 in the first are
  // all-gathered as fp8 with one amax all-reduce per step for every unit
  // (Note [float8 all-gather] in src/fsdp/float8_gather.cpp). Training is
  // bitwise the same as without; a unit with compressed params keeps its
  // compression instead.
  bool float8_all_gather = false;
};

// What prefetch tuning measured and chose (FSDPOptions::prefetch_tuning_steps).
struct FSDPPrefetchTuning {
  bool decided = false;           // false until the trial steps are done (or with no tuning)
  bool prefetch = true;           // the choice
  int trial_steps = 0;            // steps timed with each setting
  double with_prefetch_s = 0;     // median step with prefetch, slowest rank
  double without_prefetch_s = 0;  // ... without
};

// What the engine handed to collectives in one step: from the end of one
// synchronised backward to the end of the next (forwards in between, for
// evaluation or no_sync micro-batches, count towards that step). Payload
// bytes as `dtrain plan` counts them: the gathered buffer of an all-gather,
// the full gradient buffer of a reduce-scatter, the send buffer of the
// all-to-all that replaces a compressed one.
struct FSDPStepStats {
  int64_t steps = 0;                   // synchronised backward passes so far
  int64_t all_gather_calls = 0;        // parameters, in forward and backward
  int64_t all_gather_bytes = 0;
  int64_t reduce_scatter_calls = 0;    // gradients in the sharding group (OptimizerOnly: all-reduces)
  int64_t reduce_scatter_bytes = 0;
  int64_t replica_all_reduce_bytes = 0;  // Hybrid, None: gradient shards across groups (never compressed)
};

// One unit, for inspection (tests, dtrain plan, traces).
struct FSDPUnitInfo {
  std::string name;          // qualified module name; "" for the root
  int64_t numel = 0;         // parameters' elements
  int64_t padded_numel = 0;  // flat size, a multiple of the sharding group size
  int64_t shard_numel = 0;   // this rank's shard
  std::vector<std::string> parameters;
};

// One parameter as this rank holds it (checkpoints): outside forward and
// backward the parameter's data is elements [begin, end) of the flattened
// full-size parameter, a 1-D piece (possibly empty).
struct FSDPParameterShard {
  std::string name;            // qualified from the root
  std::vector<int64_t> shape;  // full shape
  int64_t begin = 0;
  int64_t end = 0;
  torch::Tensor parameter;     // the parameter itself (optimizers key their state by it)
};

namespace detail {
class FSDPState;
// Runs `forward` as the unit registered for `module` (gather, forward,
// backward hooks, reshard), or plainly when `module` is no unit.
torch::Tensor run_unit(const torch::nn::Module* module, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                       const torch::Tensor& input);
// Marks `module` as a declared unit (WrapPolicy::declared).
void declare_unit(const std::shared_ptr<torch::nn::Module>& module);
}  // namespace detail

// The engine, independent of the root module's type.
class FullyShardedBase {
 public:
  FullyShardedBase(std::shared_ptr<torch::nn::Module> root, CommPtr comm, FSDPOptions options);
  ~FullyShardedBase();
  FullyShardedBase(FullyShardedBase&&) noexcept;
  FullyShardedBase& operator=(FullyShardedBase&&) noexcept;

  // While a guard lives, backward passes keep full gradients locally (no
  // reduce-scatter); the next backward outside a guard reduces the sums.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(FullyShardedBase& fsdp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    FullyShardedBase& fsdp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // Pipeline parallelism (dtrain/pipeline.h): a step of several
  // microbatches whose forwards and backwards interleave. gather_for_step()
  // gathers every unit's parameters once (collective); until
  // reduce_step_gradients(), calls run the module on the full parameters and
  // the gradients accumulate at full size; reduce_step_gradients() reduces
  // them once, as one backward would, and reshards (collective). The
  // stage's parameters are then at full size for the whole step, for one
  // gather per unit per step. With per_microbatch, only the root is
  // gathered up front; every other unit is gathered for each microbatch's
  // forward and backward that uses it and resharded after (as the strategy
  // reshards after forward and backward): about one unit's full parameters
  // at a time, for up to two gathers per unit per microbatch. Either way the
  // gradients accumulate at full size and are reduced once per step.
  void gather_for_step(bool per_microbatch = false);
  void reduce_step_gradients();

  const FSDPOptions& options() const;
  const CommPtr& comm() const;
  // The group parameters are sharded over (the world, a hybrid group, or
  // a one-rank group for Sharding::None).
  Communicator& shard_group() const;
  std::vector<FSDPUnitInfo> units() const;
  // This rank's shards (what model->parameters() returns after sharding).
  std::vector<torch::Tensor> parameters() const;
  // Every parameter's piece on this rank, unit by unit in flat order.
  std::vector<FSDPParameterShard> parameter_shards() const;
  // The wrapped root module (its buffers are replicated, not sharded).
  const std::shared_ptr<torch::nn::Module>& root_module() const;

  // Every parameter at full size, by name, in the parameters' dtype, plus
  // buffers. Collective; with rank0_only the other ranks get an empty map.
  std::map<std::string, torch::Tensor> full_state_dict(bool rank0_only = true);

  // Whether prefetch tuning has chosen yet, what it chose and why.
  FSDPPrefetchTuning prefetch_tuning() const;

  // Bytes of the sharded state this rank holds: parameter shards and their
  // gradients (not the optimizer's state, which lives in the optimizer).
  int64_t sharded_parameter_bytes() const;

  // The last completed step's collectives (zeros before the first).
  FSDPStepStats last_step() const;

  // For callers that do not know the root's type (FullyShardedDataParallel
  // uses these): runs `forward` as the root call; a Sequential root's
  // children as units; floating inputs cast to the mixed-precision
  // param_dtype (other arguments pass through).
  torch::Tensor forward_root(const std::function<torch::Tensor()>& forward);
  torch::Tensor forward_sequential(const torch::Tensor& input);
  torch::Tensor compute_input(const torch::Tensor& input) const;
  template <class T>
    requires(!std::is_same_v<std::decay_t<T>, torch::Tensor>)
  T&& compute_input(T&& value) const {
    return std::forward<T>(value);
  }

 private:
  std::unique_ptr<detail::FSDPState> state_;
};

// FSDP around a module holder (or std::shared_ptr to a module); calling it
// runs the root forward. If the root is a torch::nn::Sequential, each child
// is entered as a unit.
template <class ModuleHolder>
class FullyShardedDataParallel : public FullyShardedBase {
 public:
  FullyShardedDataParallel(ModuleHolder module, CommPtr comm, FSDPOptions options = {})
      : FullyShardedBase(as_module_ptr(module), std::move(comm), std::move(options)), module_(std::move(module)) {}

  template <class... Args>
  torch::Tensor operator()(Args&&... args) {
    if constexpr (std::is_same_v<ModuleHolder, torch::nn::Sequential> && sizeof...(Args) == 1) {
      return forward_sequential(std::forward<Args>(args)...);
    } else {
      return forward_root([&] { return torch::Tensor(module_->forward(compute_input(std::forward<Args>(args))...)); });
    }
  }

  ModuleHolder& module() { return module_; }

 private:
  template <class M>
  static std::shared_ptr<torch::nn::Module> as_module_ptr(const torch::nn::ModuleHolder<M>& holder) {
    return holder.ptr();
  }
  template <class M>
  static std::shared_ptr<torch::nn::Module> as_module_ptr(const std::shared_ptr<M>& module) {
    return module;
  }
  ModuleHolder module_;
};

template <class ModuleHolder>
FullyShardedDataParallel<ModuleHolder> fully_shard(ModuleHolder model, CommPtr comm, FSDPOptions options = {}) {
  return FullyShardedDataParallel<ModuleHolder>(std::move(model), std::move(comm), std::move(options));
}

// A module holder that marks its module as an FSDP unit and enters it as one
// when called. Without fully_shard it is the plain holder, so one model
// source serves single-process, DDP and FSDP training.
//   struct Net : torch::nn::Module { dtrain::Sharded<Block> block{...}; ... x = block(x); };
template <class Holder>
class Sharded : public Holder {
 public:
  template <class... Args>
  explicit Sharded(Args&&... args) : Holder(std::forward<Args>(args)...) {
    if (!this->is_empty()) detail::declare_unit(this->ptr());
  }
  Sharded(std::nullptr_t) : Holder(nullptr) {}

  torch::Tensor operator()(const torch::Tensor& input) {
    auto* module = this->get();
    return detail::run_unit(module, [module](const torch::Tensor& x) { return torch::Tensor(module->forward(x)); },
                            input);
  }
};

// Gradient clipping over the shards (one all-reduce of the sum of |g|^p
// within the sharding group). Returns the global norm before clipping.
double clip_grad_norm(FullyShardedBase& fsdp, double max_norm, double norm_type = 2.0);

}  // namespace dtrain
