#include "dtrain/models.h"
#include "dtrain/gpt_stage.h"
#include "dtrain/attention.h"

#include <torch/nn/init.h>
#include <torch/utils.h>

#include <stdexcept>
#include <string>

namespace dtrain::models {

namespace {

void check_config(const GPTConfig& c) {
  auto positive = [](const char* name, int64_t value) {
    if (value <= 0)
      throw std::invalid_argument(std::string("GPTConfig: ") + name + " must be positive, got " + std::to_string(value));
  };
  positive("vocab_size", c.vocab_size);
  positive("seq_len", c.seq_len);
  positive("n_layer", c.n_layer);
  positive("n_embd", c.n_embd);
  positive("n_head", c.n_head);
  if (c.n_embd % c.n_head != 0)
    throw std::invalid_argument("GPTConfig: n_head (" + std::to_string(c.n_head) + ") must divide n_embd (" +
                                std::to_string(c.n_embd) + ")");
  if (!(c.layer_norm_eps > 0.0))
    throw std::invalid_argument("GPTConfig: layer_norm_eps must be positive, got " + std::to_string(c.layer_norm_eps));
  if (c.dropout < 0.0 || c.dropout >= 1.0)
    throw std::invalid_argument("GPTConfig: dropout must be in [0, 1), got " + std::to_string(c.dropout));
}

}  // namespace

GPTImpl::GPTImpl(const GPTConfig& config) : config_(config) {
  check_config(config_);
  wte_ = register_module("wte", deferred(torch::nn::Embedding(config_.vocab_size, config_.n_embd)));
  wpe_ = register_module("wpe", deferred(torch::nn::Embedding(config_.seq_len, config_.n_embd)));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    // Each block is an FSDP unit, entered through its Sharded<> holder
    // (a plain call when the model is not sharded).
    block_calls_.emplace_back(GPTBlock(config_).ptr());
    blocks_->push_back(block_calls_.back());
  }
  ln_f_ = register_module(
      "ln_f", gpt_layer_norm(config_));
  initialize_unless_deferred(*this);
}

torch::nn::LayerNorm gpt_layer_norm(const GPTConfig& config) {
  return deferred(
      torch::nn::LayerNorm(torch::nn::LayerNormOptions(std::vector<int64_t>{config.n_embd}).eps(config.layer_norm_eps)));
}

torch::Tensor gpt_activation(const GPTConfig& config, const torch::Tensor& x) {
  return config.gelu_tanh ? torch::gelu(x, "tanh") : torch::gelu(x);
}

// GPT-2's initialisation. LibTorch's defaults (Kaiming-uniform Linear,
// N(0, 1) Embedding) would make the tied head's initial logits far too large.
void GPTImpl::init_module(const std::string& /*name*/, torch::nn::Module& module, at::Generator& generator) {
  init_gpt_module(module, generator);
}

void init_gpt_module(torch::nn::Module& module, at::Generator& generator) {
  torch::NoGradGuard no_grad;
  if (auto* linear = module.as<torch::nn::Linear>()) {
    linear->weight.normal_(0.0, 0.02, generator);
    if (linear->bias.defined()) linear->bias.zero_();
  } else if (auto* embedding = module.as<torch::nn::Embedding>()) {
    embedding->weight.normal_(0.0, 0.02, generator);
  } else {
    default_init(module, generator);
  }
}

torch::Tensor GPTImpl::forward(torch::Tensor tokens) {
  check_materialized(wte_->weight, "GPT");
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
              "GPT: expected int64 tokens of shape [B,T], got ", tokens.scalar_type(), " ", tokens.sizes());
  const int64_t T = tokens.size(1);
  TORCH_CHECK(sequence_length(T) <= config_.seq_len, "GPT: sequence of ", sequence_length(T), " tokens is longer than seq_len ", config_.seq_len);

  auto positions = sequence_positions(T, tokens.device());  // Note [sequence context]
  auto x = wte_->forward(tokens) + wpe_->forward(positions);  // [B,T,C] + [T,C]
  x = torch::dropout(x, config_.dropout, is_training());
  for (auto& block : block_calls_) x = block(x);
  x = ln_f_->forward(x);
  // Tied head: the output projection is the token embedding, as in GPT-2. The
  // gradient of wte.weight collects both uses, so no parameter is shared
  // between two modules (which sharding would have to special-case).
  return x.matmul(wte_->weight.t());
}

int64_t GPTImpl::parameter_count(const GPTConfig& config) {
  check_config(config);
  const int64_t C = config.n_embd;
  const int64_t layer_norm = 2 * C;                                         // weight, bias
  const int64_t attention = (C * 3 * C + 3 * C) + (C * C + C);              // qkv, attn_proj
  const int64_t mlp = (C * 4 * C + 4 * C) + (4 * C * C + C);                // mlp_fc, mlp_proj
  const int64_t block = 2 * layer_norm + attention + mlp;                   // 12*C^2 + 13*C
  return config.vocab_size * C + config.seq_len * C + config.n_layer * block + layer_norm;
}

}  // namespace dtrain::models
