// Pipeline parallelism (include/dtrain/pipeline.h, dtrain/gpt_stage.h): the
// world as one pipeline of GPT stages, under GPipe and 1F1B with 1-4
// microbatches, trains as one process trains the whole GPT on the same
// batch: the stages hold GPT's weights bitwise, every step's loss within
// 1e-5, the parameters within the FSDP equivalence tolerances at the end
// (1e-6 under SGD with momentum, 1e-4 under AdamW). 1F1B keeps at most
// stages - stage microbatches in flight, GPipe all of them.
#include <dtrain/gpt_stage.h>
#include <dtrain/pipeline.h>

#include "../common/multirank_gtest.h"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>

namespace {

using dtrain::testing::world;
using dtrain::testing::world_ptr;
namespace models = dtrain::models;
namespace pp = dtrain::pp;

constexpr int64_t kGlobalBatch = 12;

models::GPTConfig config() {
  models::GPTConfig c;
  c.vocab_size = 24;
  c.seq_len = 8;
  c.n_layer = 4;  // a block for each of up to 4 stages
  c.n_embd = 32;
  c.n_head = 4;
  return c;
}

std::map<std::string, torch::Tensor> named(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : module.named_parameters()) out[item.key()] = item.value().detach();
  return out;
}

models::GPTStage my_stage() {
  const auto blocks = pp::divide_blocks(config().n_layer, world().size());
  const auto mine = blocks[static_cast<size_t>(world().rank())];
  return models::GPTStage(config(), world().rank(), world().size(), mine.first, mine.last);
}

torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

TEST(Pipeline, BlocksAreDividedEvenlyOrAsSplit) {
  auto blocks = pp::divide_blocks(7, 3);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[0].first, 0);
  EXPECT_EQ(blocks[0].last, 3);
  EXPECT_EQ(blocks[1].last, 5);
  EXPECT_EQ(blocks[2].last, 7);
  blocks = pp::divide_blocks(7, 2, {2, 5});
  EXPECT_EQ(blocks[1].first, 2);
  EXPECT_THROW(pp::divide_blocks(2, 3), std::invalid_argument);
  EXPECT_THROW(pp::divide_blocks(7, 2, {3, 3}), std::invalid_argument);
  EXPECT_THROW(pp::divide_blocks(7, 2, {7, 0}), std::invalid_argument);
  EXPECT_THROW(pp::schedule_from("interleaved"), std::invalid_argument);
}

TEST(Pipeline, StagesHoldTheGPTsWeights) {
  torch::manual_seed(5);
  models::GPT plain(config());
  torch::manual_seed(5);
  models::GPTStage stage = my_stage();
  const auto reference = named(*plain);
  for (const auto& [name, value] : named(*stage)) {
    auto it = reference.find(name);
    if (it == reference.end()) {
      ADD_FAILURE() << "GPT has no parameter " << name;
      continue;
    }
    EXPECT_TRUE(torch::equal(value, it->second)) << name;
  }
}

void train_and_compare(pp::Schedule schedule, int microbatches, bool sgd) {
  const std::string where = pp::schedule_name(schedule) + " on " + std::to_string(world().size()) + " stages, " +
                            std::to_string(microbatches) + " microbatches, " + (sgd ? "SGD" : "AdamW");
  torch::manual_seed(17);
  models::GPT plain(config());
  torch::manual_seed(17);
  models::GPTStage stage = my_stage();
  auto make_optimizer = [&](const std::vector<torch::Tensor>& parameters) -> std::unique_ptr<torch::optim::Optimizer> {
    if (sgd) return std::make_unique<torch::optim::SGD>(parameters, torch::optim::SGDOptions(0.05).momentum(0.9));
    return std::make_unique<torch::optim::AdamW>(parameters, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  };
  auto reference_optimizer = make_optimizer(plain->parameters());
  auto optimizer = make_optimizer(stage->parameters());
  pp::Pipeline pipeline(world_ptr(), schedule, microbatches);

  for (int step = 0; step < 4; ++step) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(700 + step);
    auto tokens = torch::randint(0, config().vocab_size, {kGlobalBatch, config().seq_len + 1}, generator);
    const auto inputs = tokens.narrow(1, 0, config().seq_len), targets = tokens.narrow(1, 1, config().seq_len);

    reference_optimizer->zero_grad();
    auto reference_loss = cross_entropy(plain->forward(inputs), targets);
    reference_loss.backward();
    reference_optimizer->step();

    optimizer->zero_grad();
    const double loss = pipeline.step([&](const torch::Tensor& x) { return stage->forward(x); }, cross_entropy, inputs,
                                      targets, {kGlobalBatch / microbatches, config().seq_len, config().n_embd});
    pp::sum_tied_gradients(stage->tied_weight(), pipeline);
    optimizer->step();
    EXPECT_NEAR(loss, reference_loss.item<double>(), 1e-5) << where << ", step " << step;

    const int expected = schedule == pp::Schedule::GPipe ? microbatches
                                                         : std::min(world().size() - world().rank(), microbatches);
    EXPECT_EQ(pipeline.max_in_flight(), expected) << where << ": microbatches in flight on stage " << world().rank();
  }
  const auto reference = named(*plain);
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, value] : named(*stage)) {
    const double difference = (value - reference.at(name)).abs().max().item<double>();
    if (difference > worst) {
      worst = difference;
      worst_name = name;
    }
  }
  EXPECT_LE(worst, sgd ? 1e-6 : 1e-4) << where << ": largest difference in " << worst_name;
  if (world().rank() == 0) std::printf("%s: parameters within %.3g of single-process training\n", where.c_str(), worst);
}

TEST(Pipeline, EveryScheduleEqualsSingleProcessTraining) {
  for (auto schedule : {pp::Schedule::GPipe, pp::Schedule::OneFOneB})
    for (int microbatches : {1, 2, 4}) train_and_compare(schedule, microbatches, /*sgd=*/true);
  train_and_compare(pp::Schedule::OneFOneB, 3, /*sgd=*/false);
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
