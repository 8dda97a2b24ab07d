// Join under DDP (include/dtrain/join.h): ranks with different numbers of
// batches (10/7/4 at 3 ranks, 5/3 at 2) train exactly as one process that,
// at each step, averages over the batches of the ranks that still have one
// (parameters within 1e-6 relative, SGD with momentum and AdamW, default and
// tiny buckets, with clipping); every rank, joined ones included, ends with
// the same replica; and with equal counts Join changes nothing, bitwise.
#include <dtrain/ddp.h>
#include <dtrain/join.h>

#include "../common/multirank_gtest.h"
#include "ddp_test_support.h"
#include "join_test_support.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace {

using dtrain::testing::world;
using dtrain::testing::world_ptr;
using namespace ddp_test;
using namespace join_test;

enum class Optimizer { SGD, AdamW };

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Optimizer kind, const std::vector<torch::Tensor>& params) {
  if (kind == Optimizer::SGD) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01).weight_decay(0.01));
}

struct Case {
  Optimizer optimizer = Optimizer::SGD;
  bool tiny_buckets = false;
  double clip = 0;  // max norm; 0: no clipping
};

void expect_same_as_single_process(const Case& c) {
  const auto counts = uneven_counts(world().size());
  const int rank = world().rank();

  auto reference = make_model<TinyMLP>(7);
  auto reference_optimizer = make_optimizer(c.optimizer, reference->parameters());
  for (int step = 0; step < max_count(counts); ++step) {
    const auto samples = step_samples(counts, step);
    reference_optimizer->zero_grad();
    torch::cross_entropy_loss(reference->forward(samples.inputs), samples.targets).backward();
    if (c.clip > 0) torch::nn::utils::clip_grad_norm_(reference->parameters(), c.clip);
    reference_optimizer->step();
  }

  auto replica = make_model<TinyMLP>(7 + 100 * rank);  // DDP broadcasts rank 0's weights
  dtrain::DDPOptions options;
  if (c.tiny_buckets) {
    options.bucket_cap_bytes = 600;
    options.first_bucket_cap_bytes = 200;
  }
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr(), options);
  auto optimizer = make_optimizer(c.optimizer, replica->parameters());
  dtrain::Join join(world_ptr());
  int steps = 0;
  for (int i = 0; join.next_step(i < counts[rank]); ++i) {
    const auto b = rank_batch(rank, std::min(i, counts[rank] - 1));
    optimizer->zero_grad();
    (torch::cross_entropy_loss(ddp(b.inputs), b.targets) * join.loss_scale()).backward();
    if (c.clip > 0) dtrain::clip_grad_norm(ddp, c.clip);
    optimizer->step();
    ++steps;
  }
  EXPECT_EQ(steps, max_count(counts));
  EXPECT_EQ(join.steps(), max_count(counts));
  EXPECT_LE(relative_difference(replica->parameters(), reference->parameters()), 1e-6);
}

TEST(Join, UnevenSGD) { expect_same_as_single_process({}); }
TEST(Join, UnevenAdamW) { expect_same_as_single_process({.optimizer = Optimizer::AdamW}); }
TEST(Join, UnevenTinyBuckets) { expect_same_as_single_process({.tiny_buckets = true}); }
TEST(Join, UnevenClipped) { expect_same_as_single_process({.clip = 0.05}); }

// Every rank with the same count: Join's scale is exactly 1 and the replica
// ends bitwise where training without Join ends.
TEST(Join, EqualCountsBitwiseUnchanged) {
  const int rank = world().rank();
  constexpr int kBatches = 5;
  auto plain = make_model<TinyMLP>(7);
  auto plain_ddp = dtrain::DistributedDataParallel(plain, world_ptr());
  torch::optim::AdamW plain_optimizer(plain->parameters(), torch::optim::AdamWOptions(0.01));
  for (int i = 0; i < kBatches; ++i) {
    const auto b = rank_batch(rank, i);
    plain_optimizer.zero_grad();
    torch::cross_entropy_loss(plain_ddp(b.inputs), b.targets).backward();
    plain_optimizer.step();
  }

  auto joined = make_model<TinyMLP>(7);
  auto joined_ddp = dtrain::DistributedDataParallel(joined, world_ptr());
  torch::optim::AdamW joined_optimizer(joined->parameters(), torch::optim::AdamWOptions(0.01));
  dtrain::Join join(world_ptr());
  train_with_join(join, joined_optimizer, rank, kBatches, [&](const torch::Tensor& x) { return joined_ddp(x); });

  const auto a = plain->parameters();
  const auto b = joined->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
