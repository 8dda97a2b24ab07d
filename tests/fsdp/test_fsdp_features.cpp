// FSDP beyond equivalence: what model->parameters() becomes, prefetch
// settings, mixed precision, sharded-state memory, and clear errors for
// units used outside FSDP's control.
#include <dtrain/fsdp.h>

#include "../common/multirank_gtest.h"
#include "../ddp/ddp_test_support.h"
#include "fsdp_test_models.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace {

using dtrain::Sharding;
using dtrain::testing::world;
using dtrain::testing::world_ptr;
using namespace fsdp_test;

ddp_test::Batch token_batch(int64_t step, int64_t size) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(900 + step);
  auto tokens = torch::randint(0, 256, {size, tiny_gpt_config().seq_len + 1}, generator);
  return {tokens.narrow(1, 0, tiny_gpt_config().seq_len), tokens.narrow(1, 1, tiny_gpt_config().seq_len)};
}

torch::Tensor gpt_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

TEST(Parameters, BecomeThisRanksShardsWithIdentityAndNamesKept) {
  torch::manual_seed(1);
  dtrain::models::GPT model(tiny_gpt_config());
  std::vector<const void*> identities;
  int64_t total = 0;
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) {
    identities.push_back(item.value().unsafeGetTensorImpl());
    total += item.value().numel();
    names.push_back(item.key());
  }
  auto fsdp = dtrain::fully_shard(model, world_ptr());

  int64_t local = 0;
  std::vector<std::string> names_after;
  size_t i = 0;
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(item.value().unsafeGetTensorImpl(), identities[i++]) << item.key();
    EXPECT_EQ(item.value().dim(), 1) << item.key() << " is a flat shard";
    local += item.value().numel();
    names_after.push_back(item.key());
  }
  EXPECT_EQ(names_after, names);
  auto sum = torch::tensor({local}, torch::kLong);
  world().all_reduce(sum, dtrain::ReduceOp::Sum)->wait();
  EXPECT_EQ(sum.item<int64_t>(), total) << "shards cover every element exactly once";

  // One unit per block plus the root (embeddings and the final LayerNorm).
  const auto units = fsdp.units();
  ASSERT_EQ(units.size(), 1u + tiny_gpt_config().n_layer);
  EXPECT_EQ(units[0].name, "");
  EXPECT_EQ(units[1].name, "blocks.0");
  for (const auto& unit : units) EXPECT_EQ(unit.padded_numel % world().size(), 0) << unit.name;
}

// Prefetch and the bound on outstanding reductions change when collectives
// are issued and waited for, never what is computed.
TEST(Prefetch, EverySettingGivesBitIdenticalTraining) {
  std::vector<std::map<std::string, torch::Tensor>> results;
  for (int setting = 0; setting < 6; ++setting) {
    torch::manual_seed(2);
    dtrain::models::GPT model(tiny_gpt_config());
    dtrain::FSDPOptions options;
    options.forward_prefetch = setting != 1;
    options.backward_prefetch = setting == 1   ? dtrain::BackwardPrefetch::None
                                : setting == 2 ? dtrain::BackwardPrefetch::Post
                                               : dtrain::BackwardPrefetch::Pre;
    options.max_inflight_all_gathers = setting == 3 ? 1 : 2;
    // Setting 4 keeps every unit's gradient buffer until the end of backward
    // (the bound above the unit count); 5 lets two reductions overlap.
    options.max_inflight_reductions = setting == 4 ? 100 : setting == 5 ? 2 : 1;
    auto fsdp = dtrain::fully_shard(model, world_ptr(), options);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 3; ++step) {
      const auto mine = ddp_test::local_part(token_batch(step, 12), world());
      optimizer.zero_grad();
      gpt_loss(fsdp(mine.inputs), mine.targets).backward();
      optimizer.step();
    }
    results.push_back(fsdp.full_state_dict(/*rank0_only=*/false));
  }
  for (size_t s = 1; s < results.size(); ++s) {
    for (const auto& [name, value] : results[0]) {
      EXPECT_TRUE(torch::equal(value, results[s].at(name))) << "setting " << s << ": " << name;
    }
  }
}

// Prefetch tuning (Note [prefetch tuning]): after 2 warm-up steps and 2 x 2
// trial steps it decides, every rank the same way, with positive medians;
// an evaluation forward in between changes nothing; and training is bitwise
// that of prefetch left on.
TEST(Prefetch, TuningDecidesTheSameOnEveryRankAndChangesNoArithmetic) {
  std::vector<std::map<std::string, torch::Tensor>> results;
  for (int tuned = 0; tuned < 2; ++tuned) {
    torch::manual_seed(3);
    dtrain::models::GPT model(tiny_gpt_config());
    dtrain::FSDPOptions options;
    options.prefetch_tuning_steps = tuned ? 2 : 0;
    auto fsdp = dtrain::fully_shard(model, world_ptr(), options);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
    constexpr int kSteps = 9;  // 2 warm-up + 4 trial, the 7th forward decides
    for (int step = 0; step < kSteps; ++step) {
      const auto mine = ddp_test::local_part(token_batch(step, 12), world());
      if (step == 3) {
        torch::NoGradGuard no_grad;  // evaluation is not a trial step
        fsdp(mine.inputs);
      }
      EXPECT_EQ(fsdp.prefetch_tuning().decided, tuned && step >= 7) << "step " << step;
      optimizer.zero_grad();
      gpt_loss(fsdp(mine.inputs), mine.targets).backward();
      optimizer.step();
    }
    const auto tuning = fsdp.prefetch_tuning();
    if (tuned) {
      EXPECT_EQ(tuning.trial_steps, 2);
      EXPECT_GT(tuning.with_prefetch_s, 0);
      EXPECT_GT(tuning.without_prefetch_s, 0);
      EXPECT_EQ(tuning.prefetch, tuning.with_prefetch_s <= tuning.without_prefetch_s);
      auto choices = torch::tensor({tuning.prefetch ? 1.0 : 0.0, tuning.with_prefetch_s, tuning.without_prefetch_s},
                                   torch::kFloat64);
      auto lowest = choices.clone();
      world().all_reduce(choices, dtrain::ReduceOp::Max)->wait();
      world().all_reduce(lowest, dtrain::ReduceOp::Min)->wait();
      EXPECT_TRUE(torch::equal(choices, lowest)) << "ranks decided differently";
    }
    results.push_back(fsdp.full_state_dict(/*rank0_only=*/false));
  }
  for (const auto& [name, value] : results[0]) {
    EXPECT_TRUE(torch::equal(value, results[1].at(name))) << name;
  }
}

// bf16 compute and all-gather, fp32 reduction and master weights: the loss
// follows the fp32 run within 0.02 (about 0.4% of ~5.5) over 20 steps.
TEST(MixedPrecision, Bf16TracksFp32) {
  std::vector<std::vector<double>> losses(2);
  for (int run = 0; run < 2; ++run) {
    torch::manual_seed(4);
    dtrain::models::GPT model(tiny_gpt_config());
    dtrain::FSDPOptions options;
    if (run == 1) options.mixed_precision.param_dtype = torch::kBFloat16;
    auto fsdp = dtrain::fully_shard(model, world_ptr(), options);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
    for (int step = 0; step < 20; ++step) {
      const auto mine = ddp_test::local_part(token_batch(step % 4, 12), world());
      optimizer.zero_grad();
      auto logits = fsdp(mine.inputs);
      EXPECT_EQ(logits.scalar_type(), torch::kFloat32) << "output_dtype";
      auto loss = gpt_loss(logits, mine.targets);
      loss.backward();
      optimizer.step();
      auto global = loss.detach().reshape({1});
      world().all_reduce(global, dtrain::ReduceOp::Avg)->wait();
      losses[run].push_back(global.item<double>());
    }
    for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32) << "fp32 master shards";
  }
  double worst = 0;
  for (size_t i = 0; i < losses[0].size(); ++i) worst = std::max(worst, std::abs(losses[0][i] - losses[1][i]));
  if (world().rank() == 0) {
    std::cout << "bf16 vs fp32 loss: first " << losses[1].front() << " vs " << losses[0].front() << ", last "
              << losses[1].back() << " vs " << losses[0].back() << ", largest gap " << worst << std::endl;
  }
  EXPECT_LT(worst, 0.02);
  EXPECT_GT(worst, 0.0) << "bf16 must actually change the arithmetic";
  EXPECT_LT(losses[1].back(), losses[1].front() - 0.1) << "bf16 training makes progress";
}

// Sharded state per rank (parameter shards, their gradients, AdamW's two
// moments) is at most 1/N of the single-process state plus one unit.
TEST(Memory, ShardedStateIsAboutOneNth) {
  torch::manual_seed(5);
  dtrain::models::GPT model(tiny_gpt_config());
  int64_t total = 0;
  for (const auto& p : model->parameters()) total += p.numel();
  auto fsdp = dtrain::fully_shard(model, world_ptr());
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const auto mine = ddp_test::local_part(token_batch(0, 12), world());
  gpt_loss(fsdp(mine.inputs), mine.targets).backward();
  optimizer.step();

  int64_t state_bytes = fsdp.sharded_parameter_bytes();  // shards + gradients
  for (const auto& [key, state] : optimizer.state()) {
    const auto& adam = static_cast<const torch::optim::AdamWParamState&>(*state);
    state_bytes += (adam.exp_avg().numel() + adam.exp_avg_sq().numel()) * 4;
  }
  int64_t largest_unit = 0;
  for (const auto& unit : fsdp.units()) largest_unit = std::max(largest_unit, unit.padded_numel);
  const int64_t single_process = total * 4 * 4;  // parameters, gradients, two moments
  EXPECT_LE(state_bytes, single_process / world().size() + largest_unit * 4 * 4)
      << "single process " << single_process << " bytes";
  EXPECT_GE(state_bytes, single_process / world().size() - largest_unit * 4 * 4);
}

// A model whose Linear layers are units by type, but whose forward calls
// them directly instead of through Sharded<>.
struct DirectCallsImpl : torch::nn::Module {
  DirectCallsImpl() {
    first = register_module("first", torch::nn::Linear(8, 6));
    second = register_module("second", torch::nn::Linear(6, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return second(torch::relu(first(x))); }
  torch::nn::Linear first{nullptr}, second{nullptr};
};
TORCH_MODULE(DirectCalls);

TEST(Errors, UnitUsedWithoutBeingEnteredIsNamed) {
  if (world().size() == 1) GTEST_SKIP() << "with one rank a shard is the whole tensor";
  DirectCalls model;
  dtrain::FSDPOptions options;
  options.wrap.module_types = {"LinearImpl"};
  auto fsdp = dtrain::fully_shard(model, world_ptr(), options);
  std::string message;
  try {
    fsdp(torch::randn({4, 8})).sum().backward();
  } catch (const std::exception& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("not entered through FSDP"), std::string::npos) << message;
  EXPECT_NE(message.find("'first'"), std::string::npos) << message;
  EXPECT_NE(message.find("dtrain::Sharded"), std::string::npos) << message;
}

struct WithSharded : torch::nn::Module {
  WithSharded() { register_module("inner", inner); }
  torch::Tensor forward(const torch::Tensor& x) { return inner(x); }
  dtrain::Sharded<torch::nn::Linear> inner{torch::nn::LinearOptions(8, 3)};
};

TEST(Errors, AUnitCalledOutsideTheRootCallIsNamed) {
  auto model = std::make_shared<WithSharded>();
  auto fsdp = dtrain::fully_shard(model, world_ptr());
  std::string message;
  try {
    model->inner(torch::randn({2, 8}));
  } catch (const std::exception& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("unit 'inner' was called outside the root's forward"), std::string::npos) << message;
  EXPECT_EQ(fsdp(torch::randn({2, 8})).sizes(), (std::vector<int64_t>{2, 3})) << "through the wrapper it works";
}

// Two units entered through Sharded<>: the first one's own forward fails (the
// input is too narrow), so the second is never reached. That is the unit's
// error, not a call around FSDP: the hint about units "not entered" would
// blame the user's wrapping for it (as it did for CUDA's empty-batch failure).
struct TwoSharded : torch::nn::Module {
  TwoSharded() {
    register_module("first", first);
    register_module("second", second);
  }
  torch::Tensor forward(const torch::Tensor& x) { return second(torch::relu(first(x))); }
  dtrain::Sharded<torch::nn::Linear> first{torch::nn::LinearOptions(8, 6)};
  dtrain::Sharded<torch::nn::Linear> second{torch::nn::LinearOptions(6, 3)};
};

TEST(Errors, AFailureInsideAnEnteredUnitIsNotBlamedOnWrapping) {
  auto model = std::make_shared<TwoSharded>();
  auto fsdp = dtrain::fully_shard(model, world_ptr());
  std::string message;
  try {
    fsdp(torch::randn({2, 5}));
  } catch (const std::exception& error) {
    message = error.what();
  }
  EXPECT_FALSE(message.empty()) << "a [2, 5] input into Linear(8, 6) must fail";
  EXPECT_EQ(message.find("not entered through FSDP"), std::string::npos) << message;
  EXPECT_NE(message.find("shapes cannot be multiplied"), std::string::npos) << message;
  EXPECT_EQ(fsdp(torch::randn({2, 8})).sizes(), (std::vector<int64_t>{2, 3})) << "the next forward works";
}

// Calling the root module itself skips gathering its own parameters: the
// shards have the wrong shapes, so it fails (never a silent result).
TEST(Errors, CallingTheRootDirectlyFails) {
  if (world().size() == 1) GTEST_SKIP() << "with one rank a shard is the whole tensor";
  torch::manual_seed(6);
  dtrain::models::GPT model(tiny_gpt_config());
  auto fsdp = dtrain::fully_shard(model, world_ptr());
  EXPECT_ANY_THROW(model->forward(token_batch(0, 2).inputs));
}

TEST(StateDict, RankZeroOnlyLeavesOthersEmpty) {
  torch::manual_seed(7);
  auto model = make_mlp();
  const auto before = [&] {
    std::map<std::string, torch::Tensor> values;
    for (const auto& item : model->named_parameters()) values[item.key()] = item.value().detach().clone();
    return values;
  }();
  auto fsdp = dtrain::fully_shard(model, world_ptr());
  const auto full = fsdp.full_state_dict(/*rank0_only=*/true);
  if (world().rank() == 0) {
    ASSERT_EQ(full.size(), before.size());
    for (const auto& [name, value] : before) EXPECT_TRUE(torch::equal(full.at(name), value)) << name;
  } else {
    EXPECT_TRUE(full.empty());
  }
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
