// FSDP's float8 all-gather (FSDPOptions::float8_all_gather, Note [float8
// all-gather] in src/fsdp/float8_gather.cpp): under --fp8 tensorwise the
// weights of the fp8 layers cross the wire as fp8 from the second step, and
// training is bitwise the same as with the plain gather, in fp32 and bf16
// compute; the bytes handed to the all-gathers fall to about a byte per
// weight element.
#include <dtrain/float8.h>
#include <dtrain/fsdp.h>
#include <dtrain/models.h>
#include <dtrain/plan.h>

#include "../common/multirank_gtest.h"
#include "../ddp/ddp_test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace {

using dtrain::testing::world;
using dtrain::testing::world_ptr;

// The blocks' layers: 32 -> 96, 32 -> 32, 32 -> 128, 128 -> 32, all multiples of 16.
dtrain::models::GPTConfig gpt_config() { return {.seq_len = 16, .n_layer = 3, .n_embd = 32, .n_head = 4}; }

ddp_test::Batch token_batch(int64_t step, int64_t size) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(900 + step);
  auto tokens = torch::randint(0, 256, {size, gpt_config().seq_len + 1}, generator);
  return {tokens.narrow(1, 0, gpt_config().seq_len), tokens.narrow(1, 1, gpt_config().seq_len)};
}

struct Run {
  std::map<std::string, torch::Tensor> weights;
  std::vector<double> losses;
  std::vector<int64_t> gather_bytes;  // per step
};

Run train(bool float8_all_gather, c10::ScalarType compute, dtrain::Sharding sharding, int steps = 4) {
  dtrain::Float8Settings settings;
  settings.scaling = dtrain::Float8Scaling::Tensorwise;
  settings.min_width = 0;
  dtrain::Float8Scope scope(settings);
  torch::manual_seed(21);
  dtrain::models::GPT model(gpt_config());
  dtrain::FSDPOptions options;
  options.strategy = sharding;
  if (sharding == dtrain::Sharding::Hybrid) options.hybrid_group_size = world().size() / 2;
  options.mixed_precision.param_dtype = compute;
  options.float8_all_gather = float8_all_gather;
  auto fsdp = dtrain::fully_shard(model, world_ptr(), options);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
  Run run;
  for (int step = 0; step < steps; ++step) {
    const auto mine = ddp_test::local_part(token_batch(step, 8), world());
    optimizer.zero_grad();
    const auto logits = fsdp(mine.inputs).to(torch::kFloat);
    auto loss = torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), mine.targets.reshape({-1}));
    loss.backward();
    optimizer.step();
    auto global = loss.detach().reshape({1});
    world().all_reduce(global, dtrain::ReduceOp::Avg)->wait();
    run.losses.push_back(global.item<double>());
    run.gather_bytes.push_back(fsdp.last_step().all_gather_bytes);
  }
  EXPECT_GT(dtrain::float8_calls().fp8, 0) << "the blocks' layers ran in fp8";
  run.weights = fsdp.full_state_dict(/*rank0_only=*/false);
  return run;
}

void expect_same_training(const Run& plain, const Run& fp8) {
  EXPECT_EQ(plain.losses, fp8.losses);
  for (const auto& [name, value] : plain.weights)
    EXPECT_TRUE(torch::equal(value, fp8.weights.at(name))) << name << " differs after training";
}

TEST(Float8AllGather, TrainsBitwiseAsThePlainGatherInFp32) {
  const auto plain = train(false, torch::kFloat, dtrain::Sharding::Full);
  const auto fp8 = train(true, torch::kFloat, dtrain::Sharding::Full);
  expect_same_training(plain, fp8);
  // The first step learns which weights the fp8 layers take: gathered as before.
  EXPECT_EQ(fp8.gather_bytes[0], plain.gather_bytes[0]);
  // Then the blocks' matrices (all but embeddings, norms and biases: 12 C^2
  // of each block's 12 C^2 + 13 C) travel as a byte instead of fp32's four.
  const double ratio = static_cast<double>(fp8.gather_bytes.back()) / static_cast<double>(plain.gather_bytes.back());
  if (world().rank() == 0) std::cout << "fp32 compute: fp8 all-gather bytes / plain = " << ratio << "\n";
  EXPECT_LT(ratio, 0.5);
  EXPECT_GT(ratio, 0.25);
}

TEST(Float8AllGather, TrainsBitwiseAsThePlainGatherInBf16) {
  const auto plain = train(false, torch::kBFloat16, dtrain::Sharding::Full);
  const auto fp8 = train(true, torch::kBFloat16, dtrain::Sharding::Full);
  expect_same_training(plain, fp8);
  const double ratio = static_cast<double>(fp8.gather_bytes.back()) / static_cast<double>(plain.gather_bytes.back());
  if (world().rank() == 0) std::cout << "bf16 compute: fp8 all-gather bytes / plain = " << ratio << "\n";
  EXPECT_LT(ratio, 0.75);
  EXPECT_GT(ratio, 0.5);
}

// dtrain plan --fp8 predicts the bytes the engine hands to its all-gathers
// after the first step, in fp32 and bf16 compute.
TEST(Float8AllGather, PlanPredictsTheBytes) {
  for (const auto compute : {torch::kFloat, torch::kBFloat16}) {
    const auto run = train(true, compute, dtrain::Sharding::Full, 2);
    dtrain::plan::PlanOptions options;
    options.fsdp.mixed_precision.param_dtype = compute;
    options.fsdp.float8_all_gather = true;
    options.float8.scaling = dtrain::Float8Scaling::Tensorwise;
    options.float8.min_width = 0;
    options.world_size = world().size();
    options.rank = world().rank();
    const auto plan =
        dtrain::plan::make_plan(dtrain::plan::describe_gpt(gpt_config(), 8 / world().size(), compute), options);
    int64_t gathers = 0;
    for (const auto& c : plan.collectives)
      if (c.op == "all_gather") gathers += c.payload_bytes;
    EXPECT_EQ(gathers, run.gather_bytes.back()) << c10::toString(compute);
  }
}

TEST(Float8AllGather, HybridGathersInsideTheGroup) {
  if (world().size() < 4 || world().size() % 2 != 0) GTEST_SKIP() << "hybrid needs an even world of at least 4";
  expect_same_training(train(false, torch::kFloat, dtrain::Sharding::Hybrid),
                       train(true, torch::kFloat, dtrain::Sharding::Hybrid));
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
