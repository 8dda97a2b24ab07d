// One pipeline stage of the tensor-parallel GPT (dtrain/tp_gpt.h): the
// stage models::GPTStage is (dtrain/gpt_stage.h: consecutive blocks, the
// embeddings on the first stage, ln_f and the tied head on the last, GPT's
// names and initialisation), with its blocks, embedding and head split
// across a tensor-parallel group as TPGPT splits them. For a (dp, pp, tp)
// mesh: rank (d, s, t) holds slice t of stage s.
//
// The activations between stages are whole on every rank of the group
// ([B,T,C], replicated); the last stage gives this rank's slice of the
// logits [B,T,vocab/tp] and loss() is the vocabulary-parallel cross-entropy.
// The last stage's copy of wte (the tied head) holds the same vocabulary
// rows as the first stage's on the same tp rank, so pp::sum_tied_gradients
// over the pipeline group sums matching slices.
//
// With `sequence_parallel` (and T a multiple of the group's size), the
// stage runs its blocks on this rank's sequence slice as TPGPT does: a
// later stage splits its whole input (tp::split_sequence), and a stage
// before the last gathers its output whole again
// (tp::gather_sequence_replicated), so what crosses a stage boundary is the
// same either way (Note [sequence parallel stages], src/tp/tp_gpt_stage.cpp).
#pragma once

#include <dtrain/comm.h>
#include <dtrain/models.h>
#include <dtrain/tp_gpt.h>

namespace dtrain::models {

class TPGPTStageImpl : public torch::nn::Module, public DeferredInit {
 public:
  // Stage `stage` of `stages`, blocks [first_block, last_block), split across `group`.
  TPGPTStageImpl(const GPTConfig& config, CommPtr group, int stage, int stages, int64_t first_block,
                 int64_t last_block, bool sequence_parallel = false);

  // First stage: int64 tokens [B,T] -> [B,T,C]; others [B,T,C] -> [B,T,C],
  // and the last -> this rank's logits slice [B,T,vocab_size/tp].
  torch::Tensor forward(torch::Tensor input);
  // Per-token cross-entropy [B*T] of the last stage's logits slice against
  // int64 targets [B,T], the same on the group's ranks.
  torch::Tensor loss(const torch::Tensor& logits_slice, const torch::Tensor& targets) const;

  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ == stages_ - 1; }
  // This rank's rows of wte on the stages that hold it (the first and the last); else undefined.
  torch::Tensor tied_weight() const { return wte_ ? wte_->weight : torch::Tensor(); }

  void init_module(const std::string& name, torch::nn::Module& module, at::Generator& generator) override;

 private:
  GPTConfig config_;
  CommPtr group_;
  int stage_, stages_;
  bool sequence_parallel_;
  tp::VocabParallelEmbedding wte_{nullptr};
  torch::nn::Embedding wpe_{nullptr};
  std::vector<dtrain::Sharded<TPGPTBlock>> block_calls_;
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(TPGPTStage);

}  // namespace dtrain::models
