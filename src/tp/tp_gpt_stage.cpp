// A pipeline stage of the tensor-parallel GPT (dtrain/tp_gpt_stage.h).
#include "dtrain/tp_gpt_stage.h"

#include <dtrain/gpt_stage.h>

#include <stdexcept>
#include <string>

namespace dtrain::models {

TPGPTStageImpl::TPGPTStageImpl(const GPTConfig& config, CommPtr group, int stage, int stages, int64_t first_block,
                               int64_t last_block)
    : config_(config), group_(std::move(group)), stage_(stage), stages_(stages) {
  check_stage(config_, stage, stages, first_block, last_block, "TPGPTStage");
  check_tensor_parallel(config_, group_->size());
  // GPT's registration order and names (see GPTStage).
  if (is_first() || is_last()) {
    wte_ = register_module("wte", deferred(tp::VocabParallelEmbedding(config_.vocab_size, config_.n_embd, group_)));
    if (stages_ > 1) dtrain::detail::declare_unit(wte_.ptr());  // as GPTStage: the same shards on both ends
  }
  if (is_first()) wpe_ = register_module("wpe", deferred(torch::nn::Embedding(config_.seq_len, config_.n_embd)));
  auto blocks = register_module("blocks", std::make_shared<torch::nn::Module>());
  for (int64_t i = first_block; i < last_block; ++i) {
    block_calls_.emplace_back(TPGPTBlock(config_, group_).ptr());
    blocks->register_module(std::to_string(i), block_calls_.back().ptr());
  }
  if (is_last()) {
    ln_f_ = register_module(
        "ln_f", gpt_layer_norm(config_));
  }
  initialize_unless_deferred(*this);
}

void TPGPTStageImpl::init_module(const std::string& /*name*/, torch::nn::Module& module, at::Generator& generator) {
  init_tp_gpt_module(module, generator);
}

torch::Tensor TPGPTStageImpl::forward(torch::Tensor input) {
  torch::Tensor x = input;
  if (is_first()) {
    const torch::Tensor positions = stage_positions(input, config_, "TPGPTStage");
    const auto embed = [this](const torch::Tensor& tokens) {
      check_materialized(wte_->weight, "TPGPTStage");
      return wte_->forward(tokens);
    };
    x = dtrain::detail::run_unit(wte_.get(), embed, input) + wpe_->forward(positions);
    x = torch::dropout(x, config_.dropout, is_training());
  }
  for (auto& block : block_calls_) {
    block->set_sequence_parallel(false);
    x = block(x);
  }
  if (is_last()) {
    // The tied head, column-parallel over the vocabulary: this rank's rows of wte.
    const auto head = [this](const torch::Tensor& h) {
      return tp::copy_to_group(h, group_).matmul(wte_->weight.t());
    };
    x = dtrain::detail::run_unit(wte_.get(), head, ln_f_->forward(x));
  }
  return x;
}

torch::Tensor TPGPTStageImpl::loss(const torch::Tensor& logits_slice, const torch::Tensor& targets) const {
  return tp::vocab_parallel_cross_entropy(logits_slice.reshape({-1, logits_slice.size(-1)}), targets.reshape({-1}),
                                          group_);
}

}  // namespace dtrain::models
