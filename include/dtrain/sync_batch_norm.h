// SyncBatchNorm: batch normalisation whose batch statistics cover the global
// batch (every rank's samples), so data-parallel training of a model with
// BatchNorm equals single-process training on the global batch. Plain
// BatchNorm under DDP normalises each rank's part separately.
//
// A drop-in for torch::nn::BatchNorm{1,2,3}d in a model's source: same
// parameter and buffer names (weight, bias, running_mean, running_var,
// num_batches_tracked), so checkpoints interchange. With no communicator, or
// a one-rank one, it is exactly torch's batch_norm.
#pragma once

#include <dtrain/comm.h>

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

namespace dtrain {

struct SyncBatchNormOptions {
  int64_t num_features = 0;
  double eps = 1e-5;
  double momentum = 0.1;
  bool affine = true;
};

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  explicit SyncBatchNormImpl(int64_t num_features, CommPtr comm = nullptr);
  SyncBatchNormImpl(SyncBatchNormOptions options, CommPtr comm);

  // x: [N, C, ...]. Training: statistics over N and all trailing dimensions
  // on every rank (two all-reduces forward, two backward). Eval: running
  // statistics, no communication.
  torch::Tensor forward(const torch::Tensor& x);
  void reset() override;

  // The group the statistics span; may be set after construction (models
  // are usually built before dtrain::init's communicator is at hand).
  void set_comm(CommPtr comm) { comm_ = std::move(comm); }

  // Take the multi-rank path (global statistics through all-reduces) even
  // when the group has one rank: what a step of several ranks computes and
  // holds, for a probe of its memory (`dtrain plan`, src/train/plan_model.cpp).
  void set_multi_rank_path(bool on) { multi_rank_path_ = on; }

  SyncBatchNormOptions options;
  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  CommPtr comm_;
  bool multi_rank_path_ = false;
};
TORCH_MODULE(SyncBatchNorm);

// Sets the communicator of every SyncBatchNorm in `module` (recursively).
void set_sync_batch_norm_comm(torch::nn::Module& module, const CommPtr& comm);

}  // namespace dtrain
