// DDPOptions::static_graph with find_unused_parameters: the used-parameter
// all-reduce runs in the first iteration only, training is unchanged, and a
// broken promise is an error.
#include <dtrain/ddp.h>

#include "../common/multirank_gtest.h"
#include "ddp_test_support.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace {

using dtrain::testing::world;
using dtrain::testing::world_ptr;
using namespace ddp_test;

struct Run {
  std::vector<torch::Tensor> parameters;
  std::vector<int64_t> bytes;  // per step
  bool spare_has_gradient = false;
};

// AdamW through DDP with find_unused_parameters; `use_spare(step)` says
// whether this rank uses the spare head.
Run train(bool static_graph, const std::function<bool(int)>& use_spare, int steps = 4) {
  auto replica = make_model<Branchy>(23);
  dtrain::DDPOptions options;
  options.find_unused_parameters = true;
  options.static_graph = static_graph;
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr(), options);
  torch::optim::AdamW optimizer(replica->parameters(), torch::optim::AdamWOptions(0.01));
  Run run;
  for (int step = 0; step < steps; ++step) {
    const auto mine = local_part(global_batch(step, 12), world());
    optimizer.zero_grad();
    torch::cross_entropy_loss(ddp(mine.inputs, use_spare(step)), mine.targets).backward();
    run.spare_has_gradient = replica->spare->weight.grad().defined();
    optimizer.step();
    run.bytes.push_back(ddp.last_step().bytes_sent);
  }
  for (const auto& p : replica->parameters()) run.parameters.push_back(p.detach().clone());
  return run;
}

TEST(StaticGraph, SkipsTheUsedMapAfterTheFirstStepAndTrainsLikeOneProcess) {
  const auto never = [](int) { return false; };
  const auto dynamic = train(false, never);
  const auto fixed = train(true, never);

  auto reference = make_model<Branchy>(23);
  torch::optim::AdamW reference_optimizer(reference->parameters(), torch::optim::AdamWOptions(0.01));
  for (int step = 0; step < 4; ++step) {
    const auto batch = global_batch(step, 12);
    reference_optimizer.zero_grad();
    torch::cross_entropy_loss(reference->forward(batch.inputs, false), batch.targets).backward();
    reference_optimizer.step();
  }
  EXPECT_LE(max_abs_difference(fixed.parameters, reference->parameters()), 1e-5);
  EXPECT_FALSE(fixed.spare_has_gradient) << "unused everywhere: no gradient, as on one process";

  // Six parameters, one int32 each in the used map, on more than one rank.
  const int64_t used_map = world().size() > 1 ? 6 * 4 : 0;
  EXPECT_EQ(fixed.bytes[0], dynamic.bytes[0]) << "the first step still sends the used map";
  for (size_t step = 1; step < fixed.bytes.size(); ++step) {
    EXPECT_EQ(fixed.bytes[step], dynamic.bytes[step] - used_map) << "step " << step;
  }
}

// Rank 0 always uses the spare head, the others never: the average mixes
// its gradient with zeros, exactly as without static_graph.
TEST(StaticGraph, ParametersUsedOnSomeRanksTrainAsWithoutIt) {
  const auto rank0_only = [](int) { return world().rank() == 0; };
  const auto dynamic = train(false, rank0_only);
  const auto fixed = train(true, rank0_only);
  EXPECT_LE(max_abs_difference(fixed.parameters, dynamic.parameters), 1e-6);
  EXPECT_TRUE(fixed.spare_has_gradient);
}

TEST(StaticGraph, ABrokenPromiseIsAnError) {
  std::string message;
  try {
    train(true, [](int step) { return step == 1; }, 2);  // unused in the first step, used in the second
  } catch (const std::exception& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("static_graph"), std::string::npos) << message;
  EXPECT_NE(message.find("spare."), std::string::npos) << message;
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
