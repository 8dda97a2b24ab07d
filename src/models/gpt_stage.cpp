#include "dtrain/gpt_stage.h"
#include "dtrain/attention.h"

#include <stdexcept>
#include <string>

namespace dtrain::models {

void check_stage(const GPTConfig& config, int stage, int stages, int64_t first_block, int64_t last_block,
                 const std::string& what) {
  GPTImpl::parameter_count(config);  // GPT's checks of the config
  if (stages < 1 || stage < 0 || stage >= stages || first_block < 0 || last_block < first_block ||
      last_block > config.n_layer)
    throw std::invalid_argument(what + ": stage " + std::to_string(stage) + " of " + std::to_string(stages) +
                                " with blocks [" + std::to_string(first_block) + ", " + std::to_string(last_block) +
                                ") of " + std::to_string(config.n_layer));
}

torch::Tensor stage_positions(const torch::Tensor& tokens, const GPTConfig& config, const std::string& what) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong, what,
              ": the first stage expects int64 tokens of shape [B,T], got ", tokens.scalar_type(), " ", tokens.sizes());
  const int64_t T = tokens.size(1);
  TORCH_CHECK(sequence_length(T) <= config.seq_len, what, ": sequence of ", sequence_length(T), " tokens is longer than seq_len ", config.seq_len);
  return sequence_positions(T, tokens.device());  // Note [sequence context]
}

GPTStageImpl::GPTStageImpl(const GPTConfig& config, int stage, int stages, int64_t first_block, int64_t last_block)
    : config_(config), stage_(stage), stages_(stages) {
  check_stage(config_, stage, stages, first_block, last_block, "GPTStage");
  // Registration order as GPT's: wte, wpe, blocks, ln_f (the last stage's wte
  // is the tied head's copy).
  if (is_first() || is_last()) {
    wte_ = register_module("wte", deferred(torch::nn::Embedding(config_.vocab_size, config_.n_embd)));
    // With several stages, wte is an FSDP unit of its own on the first and
    // the last stage (when sharded over dp): both then hold the same shard
    // of it, and pp::sum_tied_gradients sums the copies shard by shard.
    if (stages_ > 1) dtrain::detail::declare_unit(wte_.ptr());
  }
  if (is_first()) wpe_ = register_module("wpe", deferred(torch::nn::Embedding(config_.seq_len, config_.n_embd)));
  // "blocks.<i>" with GPT's indices: a plain container, not a ModuleList (which numbers from 0).
  auto blocks = register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int64_t i = first_block; i < last_block; ++i) {
    block_calls_.emplace_back(GPTBlock(config_).ptr());
    blocks->register_module(std::to_string(i), block_calls_.back().ptr());
  }
  if (is_last()) {
    ln_f_ = register_module(
        "ln_f", gpt_layer_norm(config_));
  }
  initialize_unless_deferred(*this);
}

void GPTStageImpl::init_module(const std::string& /*name*/, torch::nn::Module& module, at::Generator& generator) {
  init_gpt_module(module, generator);
}

torch::Tensor GPTStageImpl::forward(torch::Tensor input) {
  torch::Tensor x = input;
  if (is_first()) {
    const torch::Tensor positions = stage_positions(input, config_, "GPTStage");
    const auto embed = [this](const torch::Tensor& tokens) {
      check_materialized(wte_->weight, "GPTStage");
      return wte_->forward(tokens);
    };
    x = dtrain::detail::run_unit(wte_.get(), embed, input) + wpe_->forward(positions);
    x = torch::dropout(x, config_.dropout, is_training());
  }
  for (auto& block : block_calls_) x = block(x);
  if (is_last()) {
    // The tied head, as wte's unit (gathered for it when sharded).
    x = dtrain::detail::run_unit(wte_.get(), [this](const torch::Tensor& h) { return h.matmul(wte_->weight.t()); },
                                 ln_f_->forward(x));
  }
  return x;
}

}  // namespace dtrain::models
