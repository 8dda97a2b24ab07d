// dtrain::clip_grad_norm equals torch::nn::utils::clip_grad_norm_ on the
// single-process model, for replicated (DDP) and sharded gradients.
#include <dtrain/ddp.h>

#include "../common/multirank_gtest.h"
#include "ddp_test_support.h"

#include <gtest/gtest.h>

#include <limits>

namespace {

using dtrain::testing::world;
using dtrain::testing::world_ptr;
using namespace ddp_test;

class ClipGradNorm : public ::testing::TestWithParam<double> {};

TEST_P(ClipGradNorm, DDPMatchesTorchOnTheGlobalBatch) {
  const double norm_type = GetParam();
  const auto batch = global_batch(0, 12);
  auto reference = make_model<TinyMLP>(9);
  torch::cross_entropy_loss(reference->forward(batch.inputs), batch.targets).backward();
  const auto unclipped = gradients_of(reference->parameters());
  const double max_norm = 0.05;  // well below the norm: clipping happens
  const double expected = torch::nn::utils::clip_grad_norm_(reference->parameters(), max_norm, norm_type);

  auto replica = make_model<TinyMLP>(9);
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr());
  const auto mine = local_part(batch, world());
  torch::cross_entropy_loss(ddp(mine.inputs), mine.targets).backward();
  const double got = dtrain::clip_grad_norm(ddp, max_norm, norm_type);

  EXPECT_NEAR(got, expected, 1e-6 * expected);
  EXPECT_GT(expected, max_norm);
  EXPECT_LE(max_abs_difference(gradients_of(replica->parameters()), gradients_of(reference->parameters())), 1e-7);
  EXPECT_GT(max_abs_difference(unclipped, gradients_of(reference->parameters())), 1e-4) << "nothing was clipped";
}

// Each rank holds a disjoint flat piece of every gradient (as FSDP does).
TEST_P(ClipGradNorm, ShardedGradientsGiveTheGlobalNorm) {
  const double norm_type = GetParam();
  const auto batch = global_batch(1, 12);
  auto reference = make_model<TinyMLP>(9);
  torch::cross_entropy_loss(reference->forward(batch.inputs), batch.targets).backward();

  std::vector<torch::Tensor> shards;
  for (const auto& p : reference->parameters()) {
    const auto range = dtrain::shard_range(p.numel(), world().size(), world().rank());
    auto shard = torch::zeros({range.count}, torch::requires_grad());
    shard.mutable_grad() = p.grad().reshape({-1}).narrow(0, range.offset, range.count).clone();
    shards.push_back(shard);
  }
  const double max_norm = 0.05;
  const double expected = torch::nn::utils::clip_grad_norm_(reference->parameters(), max_norm, norm_type);
  const double got = dtrain::clip_grad_norm(shards, max_norm, norm_type, &world());
  EXPECT_NEAR(got, expected, 1e-5 * expected);

  auto params = reference->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto range = dtrain::shard_range(params[i].numel(), world().size(), world().rank());
    auto want = params[i].grad().reshape({-1}).narrow(0, range.offset, range.count);
    EXPECT_LE((shards[i].grad() - want).abs().max().item<double>(), 1e-7) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(NormTypes, ClipGradNorm, ::testing::Values(2.0, 1.0, std::numeric_limits<double>::infinity()));

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
