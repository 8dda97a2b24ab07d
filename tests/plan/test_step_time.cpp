// The predicted step time (Note [step time], src/plan/step_time.cpp) on
// hand-built models whose timeline is worked out by hand below.
#include <dtrain/pipeline.h>
#include <dtrain/plan.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

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

namespace {

// Stage `stage` of two: a root of 1000 parameters whose forward takes 10 ms
// at 1 GFLOP/s per microbatch, sending 1 MB per microbatch.
plan::ModelSpec stage_of_two(int stage) {
  plan::ModelSpec model;
  model.description = "stage " + std::to_string(stage);
  model.batch_per_rank = 2;
  plan::UnitSpec root;
  root.parameters.push_back({"weight", 1000});
  root.forward_flops = 1e7;
  model.units = {root};
  model.pipeline = {stage, 2, 2, 1'000'000, false};
  return model;
}

}  // namespace

// 1F1B over 2 ranks and 2 microbatches, f = 10 ms forward, 2f backward, m =
// 1 ms per message: rank 1 runs F0 [f+m, 2f+m], B0 [2f+m, 4f+m], F1 [4f+m,
// 5f+m], B1 [5f+m, 7f+m]; rank 0 runs F0, F1 by 2f, then B0 when rank 1's
// arrives [4f+2m, 6f+2m] and B1 [7f+2m, 9f+2m]. Then the loss's all-reduce
// and SGD over 1000 elements.
TEST(StepTime, PipelineWaitsForItsNeighbours) {
  auto options = timed(plan::Engine::DDP);
  options.world_size = 1;
  options.model_link = {0, kRate};
  const auto times = plan::pipeline_step_times({stage_of_two(0), stage_of_two(1)}, options);
  ASSERT_EQ(times.size(), 2u);
  const double f = 0.01, m = 1e6 / kRate, loss = 8 / kRate, optimizer = 12.0 * 1000 / kRate;
  EXPECT_NEAR(times[0].seconds, 9 * f + 2 * m + loss + optimizer, 1e-12);
  EXPECT_EQ(times[1].seconds, times[0].seconds);
  EXPECT_NEAR(times[0].compute_seconds, 6 * f + optimizer, 1e-12);
  EXPECT_NEAR(times[0].bubble_seconds, 3 * f + 2 * m, 1e-12);
  EXPECT_NEAR(times[1].bubble_seconds, 3 * f + 2 * m, 1e-12);  // before its first forward, and after its last backward
  options.schedule = dtrain::pp::Schedule::GPipe;  // F0 F1 B0 B1 on both: the same span here
  EXPECT_NEAR(plan::pipeline_step_times({stage_of_two(0), stage_of_two(1)}, options)[0].seconds,
              9 * f + 2 * m + loss + optimizer, 1e-12);
}

// Where the cores that compute also drive the transfers
// (ComputeRates::communication_share = 1), nothing is hidden: the DDP step
// above pays for both buckets.
TEST(StepTime, SharedCoresHideNoCommunication) {
  auto options = timed(plan::Engine::DDP);
  options.compute.communication_share = 1;
  const plan::Plan p = plan::make_plan(two_units(), options);
  const double bucket = 4.0 * kElements / kRate, optimizer = 12.0 * 2 * kElements / kRate;
  EXPECT_NEAR(p.time.exposed_communication_seconds, 2 * bucket, 1e-12);
  EXPECT_NEAR(p.time.seconds, 0.09 + optimizer + 2 * bucket, 1e-12);
}
