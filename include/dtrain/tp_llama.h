// The Llama of dtrain/llama.h with tensor parallelism inside each block
// (Megatron-style, dtrain/tensor_parallel.h) over a tensor-parallel group,
// whole or as one pipeline stage (LlamaPart):
//   attention  q_proj column-parallel (each rank: n_head / tp query heads),
//              o_proj row-parallel; k_proj and v_proj column-parallel when tp
//              divides n_kv_head (each rank: the n_kv_head / tp key/value
//              heads its query heads read), else whole on every rank (see
//              Note [replicated key/value heads] for what that costs);
//   MLP        gate_proj and up_proj column-parallel, down_proj row-parallel;
//   embed_tokens  vocabulary-parallel; the head (lm_head, or embed_tokens'
//              rows when tied) column-parallel over the vocabulary, so each
//              rank gives its slice of the logits [B, T, vocab / tp] and
//              loss() is the vocabulary-parallel cross-entropy;
//   RMSNorms   replicated; rotary embeddings applied to each rank's heads.
// One all-reduce per attention and per MLP forward, and one each backward;
// with whole key/value heads, one more per block backward for their weights'
// gradients.
//
// Names and initial numbers are Llama's: each module draws its full weight
// from the generator its name gives and keeps this rank's slice, so
// TPLlama(config, group) holds slices of Llama(config) built after the same
// seed, at any group size, also built deferred and materialised by
// fully_shard over a data-parallel group. Checkpoints save and load through
// tp::parameter_places as the GPT's do.
//
// With sequence_parallel the residual stream and the RMSNorms run on
// sequence slices [B, T/tp, dim] (gather_sequence into the column layers,
// reduce_scatter_sequence out of the row layers, the norms' weights through
// copy_to_group), as TPGPT does, for sequences tp divides; a pipeline
// stage's input and output stay whole (Note [sequence parallel stages],
// src/tp/tp_gpt_stage.cpp).
#pragma once

#include <dtrain/comm.h>
#include <dtrain/llama.h>
#include <dtrain/tensor_parallel.h>

namespace dtrain::models {

// Throws std::invalid_argument naming the numbers when `tp` does not divide
// config.n_head (each rank's query heads) or config.vocab_size (its rows).
void check_tensor_parallel(const LlamaConfig& config, int tp);
// Whether k_proj and v_proj are split across a group of `tp` ranks (tp
// divides n_kv_head) rather than whole on every rank.
bool splits_kv_heads(const LlamaConfig& config, int tp);

class TPLlamaAttentionImpl : public torch::nn::Module {
 public:
  TPLlamaAttentionImpl(const LlamaConfig& config, CommPtr group);
  // h [B,T,dim] whole sequences, already entered into the group (through
  // copy_to_group or gather_sequence) -> o_proj's output: [B,T,dim]
  // replicated, or with sequence_parallel this rank's slice [B,T/tp,dim].
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& cos, const torch::Tensor& sin,
                        bool sequence_parallel);

 private:
  LlamaConfig config_;
  CommPtr group_;
  int64_t local_heads_;
  tp::ColumnParallelLinear q_proj_{nullptr};
  tp::ColumnParallelLinear k_split_{nullptr}, v_split_{nullptr};  // tp divides n_kv_head
  torch::nn::Linear k_whole_{nullptr}, v_whole_{nullptr};         // it does not
  tp::RowParallelLinear o_proj_{nullptr};
};
TORCH_MODULE(TPLlamaAttention);

class TPLlamaMLPImpl : public torch::nn::Module {
 public:
  TPLlamaMLPImpl(const LlamaConfig& config, CommPtr group);
  // As TPLlamaAttention::forward: an entered input, a reduced (or
  // reduce-scattered) output.
  torch::Tensor forward(const torch::Tensor& h, bool sequence_parallel);

 private:
  tp::ColumnParallelLinear gate_proj_{nullptr}, up_proj_{nullptr};
  tp::RowParallelLinear down_proj_{nullptr};
};
TORCH_MODULE(TPLlamaMLP);

class TPLlamaBlockImpl : public torch::nn::Module {
 public:
  TPLlamaBlockImpl(const LlamaConfig& config, CommPtr group);
  // [B,T,dim] replicated -> replicated; after set_sequence_parallel(true),
  // sequence slices [B,T/tp,dim] -> slices.
  torch::Tensor forward(torch::Tensor x);
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }

 private:
  // norm(x) entered into the group: whole sequences for the column layers.
  torch::Tensor enter(RMSNorm& norm, const torch::Tensor& x);

  LlamaConfig config_;
  CommPtr group_;
  bool sequence_parallel_ = false;
  RMSNorm input_layernorm_{nullptr};
  TPLlamaAttention self_attn_{nullptr};
  RMSNorm post_attention_layernorm_{nullptr};
  TPLlamaMLP mlp_{nullptr};
};
TORCH_MODULE(TPLlamaBlock);

class TPLlamaImpl : public torch::nn::Module, public DeferredInit {
 public:
  TPLlamaImpl(const LlamaConfig& config, CommPtr group, bool sequence_parallel = false, LlamaPart part = {});

  // As Llama::forward, but the last stage (or the whole model) returns this
  // rank's slice of the logits, [B, T, vocab / tp] (columns
  // [rank * vocab / tp, (rank + 1) * vocab / tp)). Inputs are the same on
  // every rank of the group.
  torch::Tensor forward(torch::Tensor input);
  // Per-token cross-entropy [B*T] of forward()'s logits slice against int64
  // targets [B,T], replicated on the group's ranks.
  torch::Tensor loss(const torch::Tensor& logits_slice, const torch::Tensor& targets) const;

  const LlamaConfig& config() const { return config_; }
  // Llama's initialisation, each weight drawn full and sliced.
  void init_module(const std::string& name, torch::nn::Module& module, at::Generator& generator) override;

 private:
  torch::Tensor head(const torch::Tensor& x, bool sequence_parallel);

  LlamaConfig config_;
  CommPtr group_;
  bool sequence_parallel_;
  LlamaPart part_;
  tp::VocabParallelEmbedding embed_tokens_{nullptr};
  std::vector<dtrain::Sharded<TPLlamaBlock>> layer_calls_;  // FSDP units when sharded
  RMSNorm norm_{nullptr};
  tp::ColumnParallelLinear lm_head_{nullptr};
};
TORCH_MODULE(TPLlama);

}  // namespace dtrain::models
