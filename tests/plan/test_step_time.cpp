// The predicted step time (Note [step time], src/plan/step_time.cpp) on
// hand-built models whose timeline is worked out by hand below.
#include <dtrain/plan.h>

#include <gtest/gtest.h>

#include <cstdint>

namespace plan = dtrain::plan;

namespace {

constexpr int64_t kElements = int64_t{1} << 20;  // 4 MiB of fp32 per unit
constexpr double kRate = 1e9;                   // FLOP/s, bytes/s, and the link's bytes/s

// A root and one block of kElements parameters each; 1e7 FLOPs per forward
// for the root, the block and the head; no activations.
plan::ModelSpec two_units() {
  plan::ModelSpec model;
  model.description = "two units";
  model.batch_per_rank = 1;
  plan::UnitSpec root;
  root.parameters.push_back({"embedding.weight", kElements});
  root.forward_flops = 1e7;
  plan::UnitSpec block;
  block.name = "block";
  block.parameters.push_back({"block.weight", kElements});
  block.forward_flops = 1e7;
  model.units = {root, block};
  model.head_forward_flops = 1e7;
  return model;
}

plan::PlanOptions timed(plan::Engine engine) {
  plan::PlanOptions options;
  options.engine = engine;
  options.world_size = 2;
  options.optimizer = plan::Optimizer::SGD;
  options.compute = {kRate, kRate};
  options.link = {0, kRate};
  return options;
}

}  // namespace

TEST(StepTime, NotPredictedWithoutRatesOrALink) {
  auto options = timed(plan::Engine::FSDP);
  options.compute = {};
  EXPECT_FALSE(plan::make_plan(two_units(), options).time.predicted());
  options = timed(plan::Engine::FSDP);
  options.link = {};
  EXPECT_FALSE(plan::make_plan(two_units(), options).time.predicted());
  options.world_size = 1;  // nothing to send
  EXPECT_TRUE(plan::make_plan(two_units(), options).time.predicted());
}

// DDP: forward 30 ms; backward the head's 20 ms, the block's 20 ms (its
// 4 MiB bucket fills past the first bucket's cap and is all-reduced, 4.19 ms
// on the link, under the root's 20 ms), the root's 20 ms, then the root's
// bucket at the end: exposed. SGD streams 3 x 4 bytes of 2^21 elements.
TEST(StepTime, DDPBucketOverlapsTheBackwardBeforeIt) {
  const plan::Plan p = plan::make_plan(two_units(), timed(plan::Engine::DDP));
  ASSERT_TRUE(p.time.predicted());
  const double bucket = 4.0 * kElements / kRate;  // all-reduce over 2: 2 (G-1)/G of the payload
  const double optimizer = 12.0 * 2 * kElements / kRate;
  EXPECT_NEAR(p.time.compute_seconds, 0.09 + optimizer, 1e-12);
  EXPECT_NEAR(p.time.communication_seconds, 2 * bucket, 1e-12);
  EXPECT_NEAR(p.time.exposed_communication_seconds, bucket, 1e-12);
  EXPECT_NEAR(p.time.seconds, 0.09 + optimizer + bucket, 1e-12);
}

// FSDP (fsdp, 2 ranks): each all-gather and reduce-scatter sends 2 MiB, 2.10
// ms. Forward: the root's gather is waited for (nothing runs before it); the
// block's, prefetched, arrives under the root's forward. Backward: the
// block's gather again, prefetched before the head's backward; its
// reduce-scatter runs under the root's backward; the root's at the end is
// exposed. Without forward prefetch the block's forward gather waits too.
TEST(StepTime, FSDPPrefetchAndReductionsOverlapCompute) {
  const double transfer = 2.0 * kElements / kRate;
  auto options = timed(plan::Engine::FSDP);
  const plan::Plan p = plan::make_plan(two_units(), options);
  ASSERT_TRUE(p.time.predicted());
  EXPECT_NEAR(p.time.communication_seconds, 5 * transfer, 1e-12);  // 3 gathers, 2 reduce-scatters
  EXPECT_NEAR(p.time.exposed_communication_seconds, 2 * transfer, 1e-12);
  const double optimizer = 12.0 * kElements / kRate;  // this rank's half
  EXPECT_NEAR(p.time.seconds, 0.09 + optimizer + 2 * transfer, 1e-12);

  options.fsdp.forward_prefetch = false;
  const plan::Plan unprefetched = plan::make_plan(two_units(), options);
  EXPECT_NEAR(unprefetched.time.exposed_communication_seconds, 3 * transfer, 1e-12);
}

// The model's own collectives (tensor parallelism's) run in line.
TEST(StepTime, ModelCollectivesAreExposed) {
  auto model = two_units();
  model.collectives.push_back({"all_reduce", "activations, tensor parallel", 2, 10, 10 * 1'000'000, 0});
  auto options = timed(plan::Engine::DDP);
  EXPECT_FALSE(plan::make_plan(model, options).time.predicted());  // no model_link
  options.model_link = {1e-5, kRate};
  const plan::Plan p = plan::make_plan(model, options);
  const plan::Plan without = plan::make_plan(two_units(), options);
  const double in_line = 10 * 2 * 1e-5 + 10 * 1e6 / kRate;  // 2 hops each, 1 MB on the wire each
  EXPECT_NEAR(p.time.exposed_communication_seconds - without.time.exposed_communication_seconds, in_line, 1e-12);
  EXPECT_NEAR(p.time.seconds - without.time.seconds, in_line, 1e-12);
}
