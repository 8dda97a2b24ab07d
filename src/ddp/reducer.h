// The Reducer: DDP's gradient buckets and the autograd hooks that fill them.
//
// Note [DDP buckets]
// - Parameters are grouped into buckets (bucket_assignment.h); bucket order
//   is identical on every rank.
// - Each parameter carries a post-accumulate-grad hook. When it fires, the
//   parameter's gradient is final for this backward pass: it is copied into
//   its bucket slot (or already is the slot, with gradient_as_bucket_view) and
//   the bucket's count of missing gradients drops.
// - Buckets are launched strictly in order: bucket i starts (comm hook ->
//   collectives) once it is complete and buckets 0..i-1 have started. Every
//   rank therefore issues the same collectives in the same order, whatever
//   order its autograd engine produced gradients in.
// - The first hook of a backward pass queues an end-of-backward callback
//   (finalize). It accounts for parameters that got no gradient (zeros with
//   find_unused_parameters, else an error naming them), launches what is
//   left, waits for every bucket in order and writes the averages back into
//   .grad. backward() returns only after that.
// - Under no_sync() hooks do nothing; gradients accumulate in .grad and the
//   next synchronised backward averages the accumulated sums.
#pragma once

#include <dtrain/comm.h>
#include <dtrain/comm_hooks.h>
#include <dtrain/ddp.h>

#include <torch/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dtrain::detail {

class Reducer {
 public:
  Reducer(std::vector<std::string> names, std::vector<torch::Tensor> parameters, CommPtr comm,
          const DDPOptions& options);
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
  struct Bucket {
    GradBucket grads;
    std::vector<int> members;  // parameter indices, in slot order
    int missing = 0;           // members whose gradient is not in yet
    std::unique_ptr<PendingReduction> reduction;
  };
  struct Slot {
    int bucket = 0;
    int position = 0;  // index within the bucket's members
  };

  void install_hooks();
  void remove_hooks();
  torch::Tensor& slot_view(int parameter);
  void copy_gradient_into_slot(int parameter);
  void launch_complete_buckets();
  void finalize_backward();
  void account_for_missing_gradients();
  void write_back_gradients(const torch::Tensor& used_anywhere);
  void reset_iteration();

  std::vector<std::string> names_;
  std::vector<torch::Tensor> parameters_;
  CommPtr comm_;
  DDPOptions options_;
  CommHookPtr hook_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;

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
};

}  // namespace dtrain::detail
