// MLP, CNN and GPT (include/dtrain/models.h).
#include <dtrain/models.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace {

using dtrain::models::CNN;
using dtrain::models::GPT;
using dtrain::models::GPTBlock;
using dtrain::models::GPTConfig;
using dtrain::models::GPTImpl;
using dtrain::models::MLP;
using dtrain::models::parameter_count;

GPTConfig tiny_config() {
  GPTConfig config;
  config.seq_len = 16;
  config.n_layer = 2;
  config.n_embd = 32;
  config.n_head = 4;
  return config;
}

TEST(MLP, ShapesAndParameters) {
  torch::manual_seed(0);
  MLP mlp;
  EXPECT_EQ(mlp->forward(torch::randn({5, 1, 28, 28})).sizes(), (std::vector<int64_t>{5, 10}));
  EXPECT_EQ(parameter_count(*mlp), (784 * 256 + 256) + (256 * 256 + 256) + (256 * 10 + 10));

  MLP small(std::vector<int64_t>{32}, /*dropout=*/0.5);
  EXPECT_EQ(parameter_count(*small), (784 * 32 + 32) + (32 * 10 + 10));
  auto images = torch::randn({4, 1, 28, 28});
  small->eval();
  EXPECT_TRUE(torch::equal(small->forward(images), small->forward(images)));  // no dropout in eval
  small->train();
  EXPECT_FALSE(torch::equal(small->forward(images), small->forward(images)));
  EXPECT_THROW(MLP(std::vector<int64_t>{0}), std::invalid_argument);
}

TEST(CNN, ShapesBatchNormAndGradients) {
  torch::manual_seed(0);
  CNN cnn;
  auto logits = cnn->forward(torch::randn({4, 1, 28, 28}));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{4, 10}));
  // BatchNorm's running statistics are buffers (DDP broadcasts them).
  std::vector<std::string> buffers;
  for (const auto& item : cnn->named_buffers()) buffers.push_back(item.key());
  EXPECT_EQ(buffers, (std::vector<std::string>{"norm1.running_mean", "norm1.running_var", "norm1.num_batches_tracked",
                                               "norm2.running_mean", "norm2.running_var",
                                               "norm2.num_batches_tracked"}));
  EXPECT_NE(cnn->named_buffers()["norm1.running_mean"].abs().sum().item<float>(), 0.0f);  // updated in train mode
  logits.sum().backward();
  for (const auto& p : cnn->parameters()) EXPECT_TRUE(p.grad().defined());
  EXPECT_EQ(parameter_count(*cnn), (16 * 9 + 16) + 2 * 16 + (32 * 16 * 9 + 32) + 2 * 32 + (32 * 49 * 64 + 64) +
                                       (64 * 10 + 10));
}

TEST(GPT, ShapesStructureAndInit) {
  torch::manual_seed(0);
  const auto config = tiny_config();
  GPT gpt(config);
  auto tokens = torch::randint(0, 256, {3, 10}, torch::kLong);
  EXPECT_EQ(gpt->forward(tokens).sizes(), (std::vector<int64_t>{3, 10, 256}));

  // Blocks are a ModuleList named "blocks" of GPTBlock modules (FSDP's units).
  auto blocks = gpt->named_children()["blocks"];
  ASSERT_NE(blocks->as<torch::nn::ModuleList>(), nullptr);
  ASSERT_EQ(blocks->children().size(), 2u);
  for (const auto& block : blocks->children()) EXPECT_NE(block->as<GPTBlock>(), nullptr);

  // GPT-2 initialisation.
  auto params = gpt->named_parameters();
  EXPECT_NEAR(params["blocks.0.qkv.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(params["wte.weight"].std().item<double>(), 0.02, 0.002);
  EXPECT_EQ(params["blocks.1.mlp_fc.bias"].abs().max().item<double>(), 0.0);
  EXPECT_EQ(params["ln_f.weight"].min().item<double>(), 1.0);

  EXPECT_THROW(gpt->forward(torch::zeros({1, 17}, torch::kLong)), c10::Error);  // longer than seq_len
}

TEST(GPT, HeadIsTiedToTheTokenEmbedding) {
  torch::manual_seed(0);
  GPT gpt(tiny_config());
  for (const auto& item : gpt->named_parameters()) {
    EXPECT_EQ(item.key().find("head"), std::string::npos) << item.key();
    if (item.key() != "wte.weight") {
      EXPECT_NE(item.value().size(0), 256) << item.key() << " looks like a head";
    }
  }
  // Tokens 0..9 only: rows of wte for other tokens get gradient only through
  // the output head, so a non-zero gradient there shows the tie.
  auto tokens = torch::randint(0, 10, {2, 8}, torch::kLong);
  torch::nn::functional::cross_entropy(gpt->forward(tokens).flatten(0, 1), tokens.flatten()).backward();
  auto grad = gpt->named_parameters()["wte.weight"].grad();
  ASSERT_TRUE(grad.defined());
  EXPECT_GT(grad.slice(0, 10).abs().sum().item<double>(), 0.0);
}

TEST(GPT, ParameterCountFormula) {
  std::vector<GPTConfig> configs = {tiny_config(), GPTConfig{}};
  GPTConfig wide;
  wide.vocab_size = 300;
  wide.seq_len = 7;
  wide.n_layer = 3;
  wide.n_embd = 48;
  wide.n_head = 6;
  configs.push_back(wide);
  for (const auto& config : configs) {
    GPT gpt(config);
    EXPECT_EQ(parameter_count(*gpt), GPTImpl::parameter_count(config)) << "n_embd " << config.n_embd;
  }
  // GPT-2 small's shape (with a 256-byte vocabulary), counted without building it.
  GPTConfig gpt2;
  gpt2.seq_len = 1024;
  gpt2.n_layer = 12;
  gpt2.n_embd = 768;
  gpt2.n_head = 12;
  EXPECT_EQ(GPTImpl::parameter_count(gpt2), 256 * 768 + 1024 * 768 + 12 * (12 * 768 * 768 + 13 * 768) + 2 * 768);
}

TEST(GPT, IsCausal) {
  torch::manual_seed(0);
  GPT gpt(tiny_config());
  gpt->eval();
  auto tokens = torch::randint(0, 256, {2, 12}, torch::kLong);
  auto changed = tokens.clone();
  const int64_t t = 5;
  changed.select(1, t).fill_(0).add_(tokens.select(1, t).add(1).remainder(256));
  torch::NoGradGuard no_grad;
  auto before = gpt->forward(tokens), after = gpt->forward(changed);
  EXPECT_TRUE(torch::allclose(before.slice(1, 0, t), after.slice(1, 0, t), 0.0, 1e-6));
  for (int64_t later = t; later < 12; ++later)
    EXPECT_FALSE(torch::allclose(before.select(1, later), after.select(1, later))) << "position " << later;
}

TEST(GPT, Generate) {
  torch::manual_seed(0);
  GPT gpt(tiny_config());
  auto prompt = torch::randint(0, 256, {2, 20}, torch::kLong);  // longer than seq_len: the context is cropped
  auto greedy = gpt->generate(prompt, 5, /*temperature=*/0.0);
  EXPECT_EQ(greedy.sizes(), (std::vector<int64_t>{2, 25}));
  EXPECT_TRUE(torch::equal(greedy.slice(1, 0, 20), prompt));
  EXPECT_TRUE(torch::equal(greedy, gpt->generate(prompt, 5, 0.0)));
  EXPECT_TRUE(gpt->is_training());  // restored

  auto sample = [&](uint64_t seed) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    return gpt->generate(torch::tensor({72, 105}, torch::kLong), 6, 1.0, /*top_k=*/5, generator);
  };
  auto a = sample(1);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{8}));
  EXPECT_TRUE(torch::equal(a, sample(1)));
  EXPECT_TRUE(((a >= 0) & (a < 256)).all().item<bool>());
}

TEST(GPT, RejectsBadConfigs) {
  auto config = tiny_config();
  config.n_head = 5;
  try {
    GPT gpt(config);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("n_head (5) must divide n_embd (32)"), std::string::npos) << e.what();
  }
  config = tiny_config();
  config.n_layer = 0;
  EXPECT_THROW(GPTImpl::parameter_count(config), std::invalid_argument);
}

}  // namespace
