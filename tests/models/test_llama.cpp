// models::Llama (include/dtrain/llama.h). Its numerics against transformers'
// LlamaForCausalLM are checked by check_hugging_face.py; here, what holds
// without Python: shapes and names, the parameter count, causality, grouped
// query heads, the tied head, and deferred construction.
#include <dtrain/deferred_init.h>
#include <dtrain/llama.h>
#include <dtrain/models.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

namespace {

using dtrain::models::Llama;
using dtrain::models::LlamaConfig;
using dtrain::models::LlamaImpl;

LlamaConfig tiny_llama_config() {
  LlamaConfig config;
  config.vocab_size = 50;
  config.seq_len = 16;
  config.n_layer = 2;
  config.dim = 32;
  config.n_head = 4;
  config.n_kv_head = 2;
  config.ffn_dim = 48;
  return config;
}

TEST(Llama, NamesShapesAndParameterCount) {
  torch::manual_seed(0);
  Llama llama(tiny_llama_config());
  const auto parameters = llama->named_parameters();
  EXPECT_EQ(parameters["embed_tokens.weight"].sizes(), torch::IntArrayRef({50, 32}));
  EXPECT_EQ(parameters["layers.1.self_attn.k_proj.weight"].sizes(), torch::IntArrayRef({16, 32}));  // 2 kv heads of 8
  EXPECT_EQ(parameters["layers.0.mlp.down_proj.weight"].sizes(), torch::IntArrayRef({32, 48}));
  EXPECT_TRUE(parameters["norm.weight"].eq(1).all().item<bool>());
  EXPECT_EQ(parameters["lm_head.weight"].sizes(), torch::IntArrayRef({50, 32}));
  EXPECT_EQ(dtrain::models::parameter_count(*llama), LlamaImpl::parameter_count(tiny_llama_config()));
  auto tied = tiny_llama_config();
  tied.tie_embeddings = true;
  Llama tied_model(tied);
  EXPECT_EQ(tied_model->named_parameters().find("lm_head.weight"), nullptr);
  EXPECT_EQ(dtrain::models::parameter_count(*tied_model), LlamaImpl::parameter_count(tied));
  EXPECT_EQ(LlamaImpl::parameter_count(tiny_llama_config()) - LlamaImpl::parameter_count(tied), 50 * 32);
  auto logits = llama->forward(torch::randint(0, 50, {3, 10}, torch::kLong));
  EXPECT_EQ(logits.sizes(), torch::IntArrayRef({3, 10, 50}));
}

TEST(Llama, IsCausal) {
  torch::manual_seed(0);
  Llama llama(tiny_llama_config());
  auto tokens = torch::randint(0, 50, {2, 12}, torch::kLong);
  auto changed = tokens.clone();
  const int64_t t = 5;
  changed.select(1, t).add_(1).remainder_(50);
  torch::NoGradGuard no_grad;
  auto before = llama->forward(tokens), after = llama->forward(changed);
  EXPECT_TRUE(torch::allclose(before.slice(1, 0, t), after.slice(1, 0, t), 0.0, 1e-6));
  for (int64_t later = t; later < 12; ++later)
    EXPECT_FALSE(torch::allclose(before.select(1, later), after.select(1, later))) << "position " << later;
}

// The rotary tables: position 0 turns nothing; feature i and its partner
// i + head_dim/2 turn together by position x theta^(-2i/head_dim).
TEST(Llama, RotaryTablesTurnFeaturePairsByPositionTimesFrequency) {
  const auto [cos, sin] = dtrain::models::rotary_tables(8, 6, 10000.0, torch::kCPU);
  EXPECT_EQ(cos.sizes(), torch::IntArrayRef({8, 6}));
  EXPECT_TRUE(torch::allclose(cos.select(0, 0), torch::ones({6})));
  EXPECT_TRUE(torch::allclose(sin.select(0, 0), torch::zeros({6})));
  // Position p, feature i < 3 turns by p * 10000^(-2i/6); its partner i + 3 by the same.
  EXPECT_NEAR(cos[3][1].item<double>(), std::cos(3 * std::pow(10000.0, -2.0 / 6)), 1e-6);
  EXPECT_TRUE(torch::allclose(cos.slice(1, 0, 3), cos.slice(1, 3, 6)));
}

// With as many key/value heads as query heads, grouped-query attention is
// plain multi-head attention: a model with kv heads repeated by hand equals it.
TEST(Llama, GroupedQueryHeadsShareKeysAndValues) {
  torch::manual_seed(1);
  Llama grouped(tiny_llama_config());
  auto full_config = tiny_llama_config();
  full_config.n_kv_head = 4;
  Llama full(full_config);
  torch::NoGradGuard no_grad;
  auto source = grouped->named_parameters();
  for (auto& item : full->named_parameters()) {
    const auto& from = source[item.key()];
    if (item.key().find("k_proj") != std::string::npos || item.key().find("v_proj") != std::string::npos) {
      // Query head h reads kv head h / 2: kv head j's rows, twice in a row.
      item.value().copy_(from.view({2, 8, 32}).repeat_interleave(2, 0).reshape({32, 32}));
    } else {
      item.value().copy_(from);
    }
  }
  auto tokens = torch::randint(0, 50, {2, 9}, torch::kLong);
  EXPECT_TRUE(torch::allclose(grouped->forward(tokens), full->forward(tokens), 1e-5, 1e-6));
}

TEST(Llama, DeferredConstructionGivesTheSameWeights) {
  torch::manual_seed(4);
  Llama plain(tiny_llama_config());
  torch::manual_seed(4);
  Llama later{nullptr};
  {
    dtrain::DeferredConstruction deferred;
    later = Llama(tiny_llama_config());
  }
  EXPECT_TRUE(dtrain::has_deferred_storage(*later));
  dtrain::materialize(*later);
  auto expected = plain->named_parameters();
  for (const auto& item : later->named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), expected[item.key()])) << item.key();
}

TEST(Llama, RejectsBadConfigs) {
  auto config = tiny_llama_config();
  config.n_kv_head = 3;
  EXPECT_THROW(Llama{config}, std::invalid_argument);
  config = tiny_llama_config();
  config.dim = 36;  // heads of 9: odd, rotary embeddings need pairs
  EXPECT_THROW(Llama{config}, std::invalid_argument);
  EXPECT_THROW(Llama(tiny_llama_config())->forward(torch::zeros({1, 17}, torch::kLong)), c10::Error);
}

}  // namespace

namespace {

// Pipeline stages (dtrain::models::LlamaPart): each stage holds the whole
// model's weights under its names, and running the stages in turn gives the
// whole model's logits, tied or not.
void check_stages_compose(bool tied) {
  LlamaConfig config = tiny_llama_config();
  config.n_layer = 3;
  config.tie_embeddings = tied;
  torch::manual_seed(4);
  Llama whole(config);
  const auto whole_parameters = whole->named_parameters();
  std::vector<Llama> stages;
  const int64_t first[] = {0, 1, 2}, last[] = {1, 2, 3};
  for (int s = 0; s < 3; ++s) {
    torch::manual_seed(4);
    stages.emplace_back(config, dtrain::models::LlamaPart{s, 3, first[s], last[s]});
    for (const auto& item : stages.back()->named_parameters()) {
      ASSERT_TRUE(whole_parameters.contains(item.key())) << item.key();
      EXPECT_TRUE(item.value().equal(whole_parameters[item.key()])) << "stage " << s << ": " << item.key();
    }
  }
  EXPECT_EQ(stages[0]->named_parameters().contains("lm_head.weight"), false);
  EXPECT_EQ(stages[2]->named_parameters().contains("embed_tokens.weight"), tied);  // the tied head's copy
  EXPECT_EQ(stages[1]->named_parameters().size(), 9u);                             // one block
  const auto tokens = torch::randint(0, config.vocab_size, {2, 7}, torch::kLong);
  torch::NoGradGuard no_grad;
  auto x = tokens;
  for (auto& stage : stages) x = stage->forward(x);
  EXPECT_TRUE(torch::allclose(x, whole->forward(tokens), 1e-6, 1e-6));
}

TEST(Llama, StagesHoldTheWholeModelsWeightsAndCompose) {
  check_stages_compose(/*tied=*/false);
  check_stages_compose(/*tied=*/true);
  EXPECT_THROW(Llama(tiny_llama_config(), dtrain::models::LlamaPart{2, 2, 0, 1}), std::invalid_argument);
  EXPECT_THROW(Llama(tiny_llama_config(), dtrain::models::LlamaPart{0, 2, 1, 3}), std::invalid_argument);
}

}  // namespace
