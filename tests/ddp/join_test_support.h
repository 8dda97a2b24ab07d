// Shared pieces of the Join tests (tests/ddp/test_ddp_join.cpp,
// tests/fsdp/test_fsdp_join.cpp): uneven batch counts per rank, each rank's
// batches, and the single-process reference that, at each step, trains on
// the batches of the ranks that still have one.
#pragma once

#include "ddp_test_support.h"

#include <dtrain/join.h>

#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <vector>

namespace join_test {

constexpr int64_t kLocalBatch = 4;

// Batches per rank: the 10/7/4 at 3 ranks, 5/3 at 2.
inline std::vector<int> uneven_counts(int world) {
  switch (world) {
    case 1: return {6};
    case 2: return {5, 3};
    case 3: return {10, 7, 4};
    default: {
      std::vector<int> counts;
      for (int r = 0; r < world; ++r) counts.push_back(2 + (7 * r) % 9);
      return counts;
    }
  }
}

// Batch `step` of rank `rank`: every rank can build every rank's batches.
inline ddp_test::Batch rank_batch(int rank, int step) {
  return ddp_test::global_batch(10000 + 100 * rank + step, kLocalBatch);
}

// The samples of step `step`: the batches of the ranks that have one, in
// rank order (empty inputs when none has).
inline ddp_test::Batch step_samples(const std::vector<int>& counts, int step) {
  std::vector<torch::Tensor> inputs, targets;
  for (int r = 0; r < static_cast<int>(counts.size()); ++r) {
    if (step >= counts[r]) continue;
    auto b = rank_batch(r, step);
    inputs.push_back(b.inputs);
    targets.push_back(b.targets);
  }
  if (inputs.empty()) return {};
  return {torch::cat(inputs), torch::cat(targets)};
}

inline int max_count(const std::vector<int>& counts) { return *std::max_element(counts.begin(), counts.end()); }

// The distributed loop of dtrain/join.h: `forward` runs the wrapped model.
// A joined rank runs its step on its first batch (any batch of the shape).
inline void train_with_join(dtrain::Join& join, torch::optim::Optimizer& optimizer, int rank, int my_count,
                            const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
  for (int i = 0; join.next_step(i < my_count); ++i) {
    const auto b = rank_batch(rank, std::min(i, std::max(my_count - 1, 0)));
    optimizer.zero_grad();
    torch::Tensor loss = torch::cross_entropy_loss(forward(b.inputs), b.targets);
    (loss * join.loss_scale()).backward();
    optimizer.step();
  }
}

// Largest |a - b| over the largest |b|: a relative difference over all
// parameters together.
inline double relative_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double largest = 0;
  for (const auto& t : b) largest = std::max(largest, t.detach().abs().max().item<double>());
  return ddp_test::max_abs_difference(a, b) / std::max(largest, 1e-30);
}

}  // namespace join_test
