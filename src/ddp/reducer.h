// The Reducer: DDP's gradient buckets and the autograd hooks that fill them.
//
// Note [DDP buckets]
// - Parameters are grouped into buckets (bucket_assignment.h), first in
//   reverse registration order; bucket order is identical on every rank.
//   Each bucket is one flat buffer; each parameter has a slot in it
//   (buckets.h).
// - With gradient_as_bucket_view (the default) .grad is the slot, so
//   backward accumulates straight into the bucket and nothing is copied.
//   A gradient that is not its slot (fresh after zero_grad()'s set_to_none,
//   assigned by the user, or any gradient without views) is staged and
//   copied in when its bucket is complete, all of the bucket's at once
//   (gradient_copy.h); then .grad becomes the slot where it can
//   (contiguous, same dtype: else it is kept and the average copied back).
// - Each parameter carries a post-accumulate-grad hook. When it fires, the
//   parameter's gradient is final for this backward pass; the bucket's
//   count of missing gradients drops.
// - Buckets are launched strictly in order: bucket i starts (comm hook ->
//   collectives) once it is complete and buckets 0..i-1 have started. Every
//   rank therefore issues the same collectives in the same order, whatever
//   order its autograd engine produced gradients in.
// - The first hook of a backward pass queues an end-of-backward callback
//   (finalize). It accounts for parameters that got no gradient (zeros with
//   find_unused_parameters, else an error naming them), launches what is
//   left, waits for every bucket in order and makes the averages .grad.
//   backward() returns only after that.
// - rebuild_buckets: the first synchronised pass records the order its
//   gradients arrived in; its finalize takes rank 0's order
//   (gradient_order.h), re-buckets with the same caps and carries every
//   slot, and every .grad that was a view, over into the new buckets.
// - static_graph with find_unused_parameters: the first pass's used map is
//   kept (no all-reduce later) and the parameters this rank did not use
//   are marked ready as each later pass starts.
// - Under no_sync() hooks do nothing; gradients accumulate in .grad (in the
//   bucket, when .grad is a view) and the next synchronised backward
//   averages the accumulated sums. With mixed precision the hooks add each
//   narrow gradient to a full-precision sum instead (Note [DDP mixed
//   precision], compute_copies.h), which the next synchronised backward
//   stages with its own.
#pragma once

#include <dtrain/comm.h>
#include <dtrain/comm_hooks.h>
#include <dtrain/ddp.h>

#include "comm/comm_stream.h"
#include "ddp/buckets.h"
#include "ddp/compute_copies.h"

#include <torch/types.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::detail {

class Reducer {
 public:
  // `compute_copies` (mixed precision; null without): swapped back to the
  // masters when a synchronised backward ends (Note [DDP mixed precision]).
  Reducer(std::vector<std::string> names, std::vector<torch::Tensor> parameters, CommPtr comm,
          const DDPOptions& options, ComputeCopies* compute_copies = nullptr);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Called by each parameter's hook (on the autograd thread).
  void on_gradient_ready(int parameter);

  void set_sync(bool sync);
  bool sync() const;
  DDPStepStats last_step() const;
  std::vector<std::vector<std::string>> bucket_layout() const;

 private:
  void install_hooks();
  void remove_hooks();
  void start_backward();
  void stage_gradient(int parameter);
  // A gradient this backward or a no_sync() sum (mixed precision) to reduce.
  bool has_gradient_to_reduce(int parameter) const;
  void mark_ready(int parameter, bool used);
  void launch_complete_buckets();
  void finalize_backward();
  void account_for_missing_gradients();
  torch::Tensor parameters_used_anywhere();
  void write_back_gradients(const torch::Tensor& used_anywhere);
  void rebuild_buckets_in_gradient_order();
  void reset_iteration();

  std::vector<std::string> names_;
  std::vector<torch::Tensor> parameters_;
  CommPtr comm_;
  DDPOptions options_;
  CommHookPtr hook_;
  ComputeCopies* compute_copies_;
  // Bucket all-reduces and their hooks' work run here on a CUDA device
  // (Note [communication streams]); inactive otherwise.
  CommStream stream_;
  // The buckets' dtype: mixed precision's reduce_dtype; unset: each bucket's parameters'.
  std::optional<c10::ScalarType> bucket_dtype_;
  BucketSet buckets_;
  // Per parameter: .grad may be its bucket slot (gradient_as_bucket_view and
  // a contiguous parameter, whose gradient AccumulateGrad makes contiguous).
  std::vector<char> viewable_;

  mutable std::mutex mutex_;
  bool sync_ = true;
  // State of the backward pass in progress (reset by finalize).
  bool finalize_queued_ = false;
  std::vector<char> ready_;
  std::vector<int32_t> used_;  // got a gradient this pass, or holds one from no_sync
  size_t next_bucket_ = 0;
  int64_t bytes_this_step_ = 0;
  int64_t iteration_ = 0;
  DDPStepStats last_;
  int64_t backward_started_ns_ = -1;  // "ddp_backward" span (dtrain/trace.h), -1: not traced
  // The order gradients arrived in during the first synchronised pass
  // (rebuild_buckets); emptied once the buckets are rebuilt.
  std::vector<int> arrival_order_;
  bool buckets_rebuilt_ = false;
  // static_graph: the used-anywhere map of the first synchronised pass, and
  // the parameters this rank did not use in it (marked ready as each later
  // backward starts, so their buckets need not wait for its end).
  torch::Tensor static_used_anywhere_;
  std::vector<int> static_unused_;
};

}  // namespace dtrain::detail
