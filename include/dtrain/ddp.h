// DistributedDataParallel: a full replica of any torch::nn::Module per rank,
// gradients averaged across ranks while backward is still running.
//
//   auto world = dtrain::init(argc, argv);
//   MLP model;
//   auto ddp = dtrain::DistributedDataParallel(model, world);
//   torch::optim::SGD opt(model->parameters(), 0.1);
//   auto loss = loss_fn(ddp(x), y);      // ddp(x): broadcast buffers, model->forward(x)
//   loss.backward();                      // buckets all-reduced during backward
//   opt.step();                           // every rank applies the same update
//
// The module itself is not changed: DDP adds a post-accumulate-grad hook to
// each parameter (see Note [DDP buckets] in src/ddp/reducer.h).
#pragma once

#include <dtrain/comm.h>
#include <dtrain/grad_norm.h>
#include <dtrain/comm_hooks.h>
#include <dtrain/mixed_precision.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <string>
#include <utility>
#include <vector>

namespace dtrain {

struct DDPOptions {
  // Gradient bucket sizes. The first bucket (the last layers, whose
  // gradients come first) is small so communication starts early.
  int64_t bucket_cap_bytes = 25 << 20;
  int64_t first_bucket_cap_bytes = 1 << 20;
  // Each parameter's .grad is a view into its bucket (as PyTorch's option of
  // the same name): backward accumulates straight into the bucket and the
  // average is .grad, with no copy and no second copy of the gradients in
  // memory. A .grad that is not the view (zero_grad() with its default
  // set_to_none, or one assigned by the user) is copied in once and
  // replaced by the view; a gradient that cannot be one (a non-contiguous
  // parameter, another dtype) is copied in and out. false: always copy.
  bool gradient_as_bucket_view = true;
  // Allow parameters that get no gradient in a backward pass (a branch not
  // taken). Costs one small all-reduce per step; parameters unused on every
  // rank keep their gradient as it was.
  bool find_unused_parameters = false;
  // After the first synchronised backward, re-bucket the parameters in the
  // order their gradients became ready there (rank 0's order, the same on
  // every rank), with the same caps, so buckets fill in backward's order.
  bool rebuild_buckets = true;
  // The user promises every iteration uses the same parameters. With
  // find_unused_parameters, the used-parameter all-reduce then runs in the
  // first iteration only, and parameters unused then are marked ready as
  // each backward starts. A broken promise is an error when it shows.
  bool static_graph = false;
  // Copy rank 0's buffers (e.g. BatchNorm running statistics) to every rank
  // before each forward made through DDP.
  bool broadcast_buffers = true;
  // How buckets are averaged (dtrain/comm_hooks.h); null = plain all-reduce.
  CommHookPtr comm_hook{};
  // Compute in mixed_precision->param_dtype (e.g. bf16) while the module's
  // parameters, the optimizer and checkpoints keep fp32 master weights;
  // buckets hold and reduce reduce_dtype (fp32 by default, so the average
  // is exact to fp32; bf16 halves the traffic). Forward's floating outputs
  // come back in output_dtype. Unset: everything in the parameters' dtype.
  // See Note [DDP mixed precision] in src/ddp/compute_copies.h.
  std::optional<MixedPrecision> mixed_precision{};
  // On a CUDA device: bucket all-reduces (and the comm hook's work) on a
  // stream of their own, ordered against the compute stream by events (Note
  // [communication streams] in src/comm/comm_stream.h). false: issued from
  // the compute stream. No effect on the CPU.
  bool comm_streams = true;
};

// What the last synchronised backward pass cost.
struct DDPStepStats {
  int64_t iteration = 0;        // synchronised backward passes so far
  int64_t bytes_sent = 0;       // payload this rank handed to collectives
  int64_t buckets = 0;
  double exposed_comm_s = 0;    // time backward's end spent waiting on buckets
};

namespace detail {
class ComputeCopies;
class Reducer;
}  // namespace detail

// The engine, independent of the module's type. Use DistributedDataParallel.
class DistributedDataParallelBase {
 public:
  DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module, CommPtr comm, DDPOptions options);
  ~DistributedDataParallelBase();
  DistributedDataParallelBase(DistributedDataParallelBase&&) noexcept;
  DistributedDataParallelBase& operator=(DistributedDataParallelBase&&) noexcept;

  // Called by forward: broadcasts buffers from rank 0 (broadcast_buffers)
  // and, with mixed precision, points the parameters at their compute copies.
  void before_forward();
  // Mixed precision: a floating input cast to param_dtype (else as it is).
  torch::Tensor compute_input(const torch::Tensor& input) const;
  // Called by forward on its result: a floating output cast to output_dtype
  // and, when no backward can follow (grad mode off), the master weights
  // back in the module at once. Without mixed precision: `output`.
  torch::Tensor finish_forward(const torch::Tensor& output);

  // While a guard lives, backward passes only accumulate local gradients;
  // the next backward outside a guard averages the accumulated sums.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallelBase& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallelBase& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  const CommPtr& comm() const { return comm_; }
  const DDPOptions& options() const { return options_; }
  std::vector<torch::Tensor> parameters() const;
  DDPStepStats last_step() const;
  // Parameter names per bucket, in launch order (identical on every rank).
  std::vector<std::vector<std::string>> bucket_layout() const;

 private:
  std::shared_ptr<torch::nn::Module> module_;
  CommPtr comm_;
  DDPOptions options_;
  std::unique_ptr<detail::ComputeCopies> compute_copies_;  // mixed precision; outlives the reducer
  std::unique_ptr<detail::Reducer> reducer_;
};

// DDP around a module holder (MLP, or any TORCH_MODULE type) or a
// std::shared_ptr to a module; calling it forwards to the module.
template <class ModuleHolder>
class DistributedDataParallel : public DistributedDataParallelBase {
 public:
  DistributedDataParallel(ModuleHolder module, CommPtr comm, DDPOptions options = {})
      : DistributedDataParallelBase(as_module_ptr(module), std::move(comm), std::move(options)),
        module_(std::move(module)) {}

  template <class... Args>
  auto operator()(Args&&... args) {
    before_forward();
    auto output = module_->forward(as_compute_input(std::forward<Args>(args))...);
    if constexpr (std::is_same_v<decltype(output), torch::Tensor>) {
      return finish_forward(output);
    } else {
      return output;
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

  template <class Arg>
  decltype(auto) as_compute_input(Arg&& arg) const {
    if constexpr (std::is_same_v<std::decay_t<Arg>, torch::Tensor>) {
      return compute_input(arg);
    } else {
      return std::forward<Arg>(arg);
    }
  }

  ModuleHolder module_;
};

// The global gradient norm of what a data-parallel engine trains, clipped to
// max_norm exactly as torch::nn::utils::clip_grad_norm_ does on one process.
// Returns the total norm before clipping. norm_type may be infinity.
double clip_grad_norm(DistributedDataParallelBase& ddp, double max_norm, double norm_type = 2.0);

// The same over any parameters, replicated or sharded: dtrain/grad_norm.h.

}  // namespace dtrain
