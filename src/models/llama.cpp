// The Llama model (include/dtrain/llama.h): embeddings, blocks, head, its
// configuration's checks and Hugging Face's initialisation.
#include "dtrain/llama.h"

#include <stdexcept>
#include <string>

namespace dtrain::models {

LlamaPart check_llama(const LlamaConfig& c, LlamaPart part) {
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
  if (part.last_block < 0) part.last_block = c.n_layer;
  if (part.stages < 1 || part.stage < 0 || part.stage >= part.stages || part.first_block < 0 ||
      part.last_block < part.first_block || part.last_block > c.n_layer)
    throw std::invalid_argument("Llama: stage " + std::to_string(part.stage) + " of " + std::to_string(part.stages) +
                                " with blocks [" + std::to_string(part.first_block) + ", " +
                                std::to_string(part.last_block) + ") of " + std::to_string(c.n_layer));
  return part;
}

int64_t default_ffn_dim(int64_t dim) {
  const int64_t width = (8 * dim + 2) / 3;
  return (width + 63) / 64 * 64;
}

LlamaImpl::LlamaImpl(const LlamaConfig& config, LlamaPart part) : config_(config), part_(check_llama(config, part)) {
  // Registration order and names as the whole model's. With tied embeddings
  // the last stage's embed_tokens is the head's copy: an FSDP unit of its own
  // on the first and the last stage, so both hold the same shard of it and
  // pp::sum_tied_gradients sums the copies shard by shard.
  const bool tied_copy = config_.tie_embeddings && part_.stages > 1;
  if (part_.is_first() || (part_.is_last() && config_.tie_embeddings)) {
    embed_tokens_ = register_module("embed_tokens", deferred(torch::nn::Embedding(config_.vocab_size, config_.dim)));
    if (tied_copy) dtrain::detail::declare_unit(embed_tokens_.ptr());
  }
  // "layers.<i>" with the whole model's indices: a plain container, not a
  // ModuleList (which numbers from 0).
  auto layers = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = part_.first_block; i < part_.last_block; ++i) {
    layer_calls_.emplace_back(LlamaBlock(config_).ptr());  // an FSDP unit when sharded
    layers->register_module(std::to_string(i), layer_calls_.back().ptr());
  }
  if (part_.is_last()) {
    norm_ = register_module("norm", deferred(RMSNorm(config_.dim, config_.rms_norm_eps)));
    if (!config_.tie_embeddings)
      lm_head_ = register_module(
          "lm_head", deferred(torch::nn::Linear(torch::nn::LinearOptions(config_.dim, config_.vocab_size).bias(false))));
  }
  initialize_unless_deferred(*this);
}

void LlamaImpl::init_module(const std::string& /*name*/, torch::nn::Module& module, at::Generator& generator) {
  init_llama_module(module, generator);
}

void init_llama_module(torch::nn::Module& module, at::Generator& generator) {
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

torch::Tensor LlamaImpl::forward(torch::Tensor input) {
  torch::Tensor x = input;
  if (part_.is_first()) {
    check_materialized(embed_tokens_->weight, "Llama");
    TORCH_CHECK(input.dim() == 2 && input.scalar_type() == torch::kLong,
                "Llama: expected int64 tokens of shape [B,T], got ", input.scalar_type(), " ", input.sizes());
    TORCH_CHECK(sequence_length(input.size(1)) <= config_.seq_len, "Llama: sequence of ", sequence_length(input.size(1)),
                " tokens is longer than its context of ", config_.seq_len);
    const auto embed = [this](const torch::Tensor& tokens) { return embed_tokens_->forward(tokens); };
    x = dtrain::detail::run_unit(embed_tokens_.get(), embed, input);
  }
  for (auto& layer : layer_calls_) x = layer(x);
  if (!part_.is_last()) return x;
  x = norm_->forward(x);
  if (!config_.tie_embeddings) return lm_head_->forward(x);
  // The tied head, as embed_tokens' unit (gathered for it when it is one).
  return dtrain::detail::run_unit(
      embed_tokens_.get(), [this](const torch::Tensor& h) { return h.matmul(embed_tokens_->weight.t()); }, x);
}

int64_t LlamaImpl::parameter_count(const LlamaConfig& config) {
  check_llama(config);
  const int64_t C = config.dim, head_dim = C / config.n_head;
  const int64_t F = config.ffn_dim > 0 ? config.ffn_dim : default_ffn_dim(C);
  const int64_t attention = C * config.n_head * head_dim * 2 + C * config.n_kv_head * head_dim * 2;
  const int64_t block = 2 * C + attention + 3 * C * F;
  return config.vocab_size * C * (config.tie_embeddings ? 1 : 2) + config.n_layer * block + C;
}

}  // namespace dtrain::models
