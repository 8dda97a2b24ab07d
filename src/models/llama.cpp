// The Llama model (include/dtrain/llama.h): embeddings, blocks, head, its
// configuration's checks and Hugging Face's initialisation.
#include "dtrain/llama.h"

#include <stdexcept>
#include <string>

namespace dtrain::models {

namespace {

void check_config(const LlamaConfig& c) {
  auto positive = [](const char* name, int64_t value) {
    if (value <= 0)
      throw std::invalid_argument(std::string("LlamaConfig: ") + name + " must be positive, got " + std::to_string(value));
  };
  positive("vocab_size", c.vocab_size);
  positive("seq_len", c.seq_len);
  positive("n_layer", c.n_layer);
  positive("dim", c.dim);
  positive("n_head", c.n_head);
  positive("n_kv_head", c.n_kv_head);
  if (c.ffn_dim < 0) throw std::invalid_argument("LlamaConfig: ffn_dim must be >= 0 (0: the default), got " + std::to_string(c.ffn_dim));
  if (c.dim % c.n_head != 0)
    throw std::invalid_argument("LlamaConfig: n_head (" + std::to_string(c.n_head) + ") must divide dim (" +
                                std::to_string(c.dim) + ")");
  if ((c.dim / c.n_head) % 2 != 0)
    throw std::invalid_argument("LlamaConfig: the head width dim / n_head (" + std::to_string(c.dim / c.n_head) +
                                ") must be even (rotary embeddings rotate pairs)");
  if (c.n_head % c.n_kv_head != 0)
    throw std::invalid_argument("LlamaConfig: n_kv_head (" + std::to_string(c.n_kv_head) + ") must divide n_head (" +
                                std::to_string(c.n_head) + ")");
  if (!(c.rope_theta > 0.0)) throw std::invalid_argument("LlamaConfig: rope_theta must be positive");
  if (!(c.rms_norm_eps > 0.0)) throw std::invalid_argument("LlamaConfig: rms_norm_eps must be positive");
  if (c.dropout < 0.0 || c.dropout >= 1.0)
    throw std::invalid_argument("LlamaConfig: dropout must be in [0, 1), got " + std::to_string(c.dropout));
}

}  // namespace

int64_t default_ffn_dim(int64_t dim) {
  const int64_t width = (8 * dim + 2) / 3;
  return (width + 63) / 64 * 64;
}

LlamaImpl::LlamaImpl(const LlamaConfig& config) : config_(config) {
  check_config(config_);
  embed_tokens_ = register_module("embed_tokens", deferred(torch::nn::Embedding(config_.vocab_size, config_.dim)));
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    layer_calls_.emplace_back(LlamaBlock(config_).ptr());  // an FSDP unit when sharded
    layers_->push_back(layer_calls_.back());
  }
  norm_ = register_module("norm", deferred(RMSNorm(config_.dim, config_.rms_norm_eps)));
  if (!config_.tie_embeddings)
    lm_head_ = register_module(
        "lm_head", deferred(torch::nn::Linear(torch::nn::LinearOptions(config_.dim, config_.vocab_size).bias(false))));
  initialize_unless_deferred(*this);
}

void LlamaImpl::init_module(const std::string& /*name*/, torch::nn::Module& module, at::Generator& generator) {
  torch::NoGradGuard no_grad;
  if (auto* linear = module.as<torch::nn::Linear>()) {
    linear->weight.normal_(0.0, 0.02, generator);
  } else if (auto* embedding = module.as<torch::nn::Embedding>()) {
    embedding->weight.normal_(0.0, 0.02, generator);
  } else if (auto* norm = module.as<RMSNorm>()) {
    norm->reset_parameters();
  } else {
    default_init(module, generator);
  }
}

torch::Tensor LlamaImpl::forward(torch::Tensor tokens) {
  check_materialized(embed_tokens_->weight, "Llama");
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
              "Llama: expected int64 tokens of shape [B,T], got ", tokens.scalar_type(), " ", tokens.sizes());
  TORCH_CHECK(tokens.size(1) <= config_.seq_len, "Llama: sequence of ", tokens.size(1),
              " tokens is longer than its context of ", config_.seq_len);
  auto x = embed_tokens_->forward(tokens);
  for (auto& layer : layer_calls_) x = layer(x);
  x = norm_->forward(x);
  return config_.tie_embeddings ? x.matmul(embed_tokens_->weight.t()) : lm_head_->forward(x);
}

int64_t LlamaImpl::parameter_count(const LlamaConfig& config) {
  check_config(config);
  const int64_t C = config.dim, head_dim = C / config.n_head;
  const int64_t F = config.ffn_dim > 0 ? config.ffn_dim : default_ffn_dim(C);
  const int64_t attention = C * config.n_head * head_dim * 2 + C * config.n_kv_head * head_dim * 2;
  const int64_t block = 2 * C + attention + 3 * C * F;
  return config.vocab_size * C * (config.tie_embeddings ? 1 : 2) + config.n_layer * block + C;
}

}  // namespace dtrain::models
