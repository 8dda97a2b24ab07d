// Shared pieces of the DDP tests: small models, deterministic global batches,
// and comparisons. Every rank can build any step's global batch, so each rank
// trains the single-process reference itself, locally.
#pragma once

#include <dtrain/comm.h>
#include <dtrain/sync_batch_norm.h>

#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace ddp_test {

constexpr int64_t kImage = 8;    // images are 1 x 8 x 8
constexpr int64_t kClasses = 4;

struct TinyMLPImpl : torch::nn::Module {
  TinyMLPImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kImage * kImage, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 32));
    fc3 = register_module("fc3", torch::nn::Linear(32, kClasses));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(fc1(x.flatten(1)));
    return fc3(torch::relu(fc2(h)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(TinyMLP);

// A small CNN whose BatchNorm is a SyncBatchNorm (the conv has no bias: in
// front of a BatchNorm its gradient is zero up to rounding, which AdamW
// would amplify into noise): with no communicator it is
// torch's batch_norm (the single-process reference), with one it normalises
// over the global batch.
struct TinyCNNImpl : torch::nn::Module {
  TinyCNNImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 6, 3).padding(1).bias(false)));
    norm = register_module("norm", dtrain::SyncBatchNorm(6));
    fc = register_module("fc", torch::nn::Linear(6 * (kImage / 2) * (kImage / 2), kClasses));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::max_pool2d(torch::relu(norm(conv(x))), 2);
    return fc(h.flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  dtrain::SyncBatchNorm norm{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(TinyCNN);

struct Batch {
  torch::Tensor inputs, targets;
};

// Global batch `step` of `size` samples: the same on every rank. Targets are
// a fixed function of the inputs, so training makes progress.
inline Batch global_batch(int64_t step, int64_t size) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  auto inputs = torch::randn({size, 1, kImage, kImage}, generator);
  auto targets = inputs.flatten(1).narrow(1, 0, kClasses * 4).view({size, kClasses, 4}).sum(2).argmax(1);
  return {inputs, targets};
}

// This rank's contiguous part of a global batch.
inline Batch local_part(const Batch& batch, const dtrain::Communicator& comm) {
  const auto range = dtrain::shard_range(batch.inputs.size(0), comm.size(), comm.rank());
  return {batch.inputs.narrow(0, range.offset, range.count), batch.targets.narrow(0, range.offset, range.count)};
}

inline double max_abs_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, (a[i].detach().to(torch::kDouble) - b[i].detach().to(torch::kDouble)).abs().max().item<double>());
  }
  return a.size() == b.size() ? worst : 1e30;
}

inline std::vector<torch::Tensor> gradients_of(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters) grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return grads;
}

// The same initial weights on every call (a private generator would be
// nicer, but torch::nn initialises from the global one).
template <class Model>
Model make_model(uint64_t seed) {
  torch::manual_seed(seed);
  return Model();
}

// An MLP with a head that only some steps (or ranks) use.
struct BranchyImpl : torch::nn::Module {
  BranchyImpl() {
    body = register_module("body", torch::nn::Linear(kImage * kImage, 16));
    head = register_module("head", torch::nn::Linear(16, kClasses));
    spare = register_module("spare", torch::nn::Linear(16, kClasses));
  }
  torch::Tensor forward(const torch::Tensor& x, bool use_spare) {
    auto h = torch::relu(body(x.flatten(1)));
    return use_spare ? head(h) + spare(h) : head(h);
  }
  torch::nn::Linear body{nullptr}, head{nullptr}, spare{nullptr};
};
TORCH_MODULE(Branchy);

}  // namespace ddp_test
