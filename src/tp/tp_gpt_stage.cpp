// A pipeline stage of the tensor-parallel GPT (dtrain/tp_gpt_stage.h).
#include "dtrain/tp_gpt_stage.h"

#include <dtrain/attention.h>
#include <dtrain/gpt_stage.h>

#include <stdexcept>
#include <string>

namespace dtrain::models {

TPGPTStageImpl::TPGPTStageImpl(const GPTConfig& config, CommPtr group, int stage, int stages, int64_t first_block,
                               int64_t last_block, bool sequence_parallel)
    : config_(config), group_(std::move(group)), stage_(stage), stages_(stages), sequence_parallel_(sequence_parallel) {
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

// Note [sequence parallel stages]
// Under sequence parallelism a stage's blocks hold this rank's slice of the
// sequence, but what a stage sends the next stays the whole activation on
// every tp rank: a later stage takes its slice of it (split_sequence, whose
// backward gathers the slices' gradients: the whole gradient, alike on every
// tp rank, which goes back), and a stage before the last gathers its slices
// (gather_sequence_replicated, whose backward takes this rank's slice of that
// gradient). Stages then agree on what crosses whatever T is (a sampling
// prompt whose length tp does not divide runs without sequence parallelism
// on every stage alike), at the cost of one all-gather over tp per boundary
// and direction; sending the slices instead would cut the boundary's bytes
// by tp (Megatron-LM's scatter-gather), left for later. The first stage
// embeds into the slice as TPGPT does (the vocabulary rows' partial lookups
// reduce-scattered); the last gathers after ln_f, before the head. TPLlama's
// stages do the same (src/tp/tp_llama.cpp).
torch::Tensor TPGPTStageImpl::forward(torch::Tensor input) {
  torch::Tensor x = input;
  const int64_t T = input.size(1), tp = group_->size();
  const bool sequence_parallel = sequence_parallel_ && tp > 1 && T % tp == 0;
  const int64_t slice = T / tp, first = group_->rank() * slice;
  if (is_first()) {
    const torch::Tensor positions = stage_positions(input, config_, "TPGPTStage");
    const auto embed = [this, sequence_parallel](const torch::Tensor& tokens) {
      check_materialized(wte_->weight, "TPGPTStage");
      return sequence_parallel ? tp::reduce_scatter_sequence(wte_->partial(tokens), group_) : wte_->forward(tokens);
    };
    x = dtrain::detail::run_unit(wte_.get(), embed, input);
    if (sequence_parallel) {
      // wpe through copy_to_group: each rank sees only its positions (as TPGPT).
      x = x + torch::embedding(tp::copy_to_group(wpe_->weight, group_), positions.narrow(0, first, slice));
      x = models::dropout_of_slice(x, config_.dropout, is_training(), {input.size(0), T, config_.n_embd}, 1, first);
    } else {
      x = torch::dropout(x + wpe_->forward(positions), config_.dropout, is_training());
    }
  } else if (sequence_parallel) {
    x = tp::split_sequence(input, group_);
  }
  // The blocks keep the layout until the next forward: a recomputation in
  // backward (activation checkpointing) must see the same one.
  for (auto& block : block_calls_) {
    block->set_sequence_parallel(sequence_parallel);
    x = block(x);
  }
  if (!is_last()) return sequence_parallel ? tp::gather_sequence_replicated(x, group_) : x;
  // The tied head, column-parallel over the vocabulary: this rank's rows of
  // wte, over whole sequences (gather_sequence's backward sums the ranks'
  // vocabulary slices' contributions, as copy_to_group's does).
  const auto head = [this, sequence_parallel](const torch::Tensor& h) {
    return (sequence_parallel ? tp::gather_sequence(h, group_) : tp::copy_to_group(h, group_)).matmul(wte_->weight.t());
  };
  return dtrain::detail::run_unit(wte_.get(), head,
                                  sequence_parallel ? slice_layer_norm(ln_f_, x, group_) : ln_f_->forward(x));
}

torch::Tensor TPGPTStageImpl::loss(const torch::Tensor& logits_slice, const torch::Tensor& targets) const {
  return tp::vocab_parallel_cross_entropy(logits_slice.reshape({-1, logits_slice.size(-1)}), targets.reshape({-1}),
                                          group_);
}

}  // namespace dtrain::models
