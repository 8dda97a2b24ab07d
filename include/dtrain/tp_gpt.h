// The GPT of dtrain/models.h with tensor parallelism inside each block
// (Megatron-style, dtrain/tensor_parallel.h) over a tensor-parallel group:
//   attention  qkv column-parallel in 3 sections (each rank: n_head / tp
//              heads of q, k and v), attn_proj row-parallel;
//   MLP        mlp_fc column-parallel, mlp_proj row-parallel;
//   wte        vocabulary-parallel; the tied head gives each rank its slice of
//              the logits [B, T, vocab / tp], and loss() is the
//              vocabulary-parallel cross-entropy, so no rank forms the full
//              logits;
//   wpe, LayerNorms  replicated.
// One all-reduce per attention and per MLP forward, and one each backward.
//
// Parameter names, and the numbers they start with, are GPT's: module N is
// initialised from the same generator (seeded from the init seed and N, see
// dtrain/deferred_init.h) drawing the full tensor, of which each rank keeps
// its slice. So TPGPT(config, group) built after torch::manual_seed(s) holds
// slices of GPT(config) built after the same seed, at any group size, also
// when built deferred and materialised by fully_shard over a data-parallel
// group (a 2-D mesh: DeviceMesh {{"dp", -1}, {"tp", T}}). Dropout masks are
// drawn on each rank, so with dropout > 0 results depend on tp.
//
// With sequence_parallel, the activations outside attention and the MLP (the
// residual stream, LayerNorms, dropout, the embeddings' sum) are split along
// the sequence across the group instead of replicated: gather_sequence at the
// entry of each column layer and reduce_scatter_sequence at the exit of each
// row layer replace copy_to_group and reduce_from_group (the same bytes
// moved), and the replicated parameters used on sequence slices (LayerNorms,
// wpe, the row layers' biases) enter through copy_to_group, so their
// gradients are summed over the group. Same results; applies to sequences
// whose length tp divides (others, e.g. while sampling, take the plain path).
#pragma once

#include <dtrain/comm.h>
#include <dtrain/models.h>
#include <dtrain/tensor_parallel.h>

namespace dtrain::models {

// Throws std::invalid_argument naming the numbers when `tp` does not divide
// config.n_head (each rank's heads) or config.vocab_size (its vocabulary rows).
void check_tensor_parallel(const GPTConfig& config, int tp);

// GPT-2's initialisation of one module of a tensor-parallel GPT (TPGPT or
// a TPGPTStage): each weight drawn at full size from the module's generator
// exactly as GPTImpl::init_module draws it, and this rank's slice kept.
void init_tp_gpt_module(torch::nn::Module& module, at::Generator& generator);

// A LayerNorm on this rank's sequence slice (sequence parallelism): its
// replicated parameters enter through copy_to_group, so their gradients are
// summed over the group's slices. The blocks' norms, and ln_f of TPGPT and
// of a TPGPTStage.
torch::Tensor slice_layer_norm(const torch::nn::LayerNorm& norm, const torch::Tensor& x, const CommPtr& group);

class TPGPTBlockImpl : public torch::nn::Module {
 public:
  TPGPTBlockImpl(const GPTConfig& config, CommPtr group);
  // [B,T,C] replicated -> [B,T,C] replicated; after
  // set_sequence_parallel(true), [B,T/tp,C] sequence slices -> sequence slices.
  torch::Tensor forward(torch::Tensor x);
  // The model says, before each forward, which layout its blocks get (a unit
  // under FSDP is called with one tensor).
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }

 private:
  torch::Tensor attention(const torch::Tensor& h, int64_t B, int64_t T);

  CommPtr group_;
  bool sequence_parallel_ = false;
  int64_t local_heads_;
  double dropout_;
  GPTConfig config_;
  torch::nn::LayerNorm ln_1_{nullptr};
  tp::ColumnParallelLinear qkv_{nullptr};
  tp::RowParallelLinear attn_proj_{nullptr};
  torch::nn::LayerNorm ln_2_{nullptr};
  tp::ColumnParallelLinear mlp_fc_{nullptr};
  tp::RowParallelLinear mlp_proj_{nullptr};
};
TORCH_MODULE(TPGPTBlock);

class TPGPTImpl : public torch::nn::Module, public DeferredInit {
 public:
  TPGPTImpl(const GPTConfig& config, CommPtr group, bool sequence_parallel = false);

  // int64 tokens [B,T], the same on every rank of the group -> this rank's
  // slice of the logits, [B, T, vocab_size / tp] (columns
  // [rank * vocab / tp, (rank + 1) * vocab / tp)).
  torch::Tensor forward(torch::Tensor tokens);
  // Per-token cross-entropy [B*T] of forward()'s logits slice against int64
  // targets [B,T], replicated on the group's ranks.
  torch::Tensor loss(const torch::Tensor& logits_slice, const torch::Tensor& targets) const;

  const GPTConfig& config() const { return config_; }
  const CommPtr& group() const { return group_; }
  // GPT's initialisation (GPTImpl::init_module), drawn full and sliced.
  void init_module(const std::string& name, torch::nn::Module& module, at::Generator& generator) override;

 private:
  torch::Tensor forward_sequence_parallel(const torch::Tensor& tokens);

  GPTConfig config_;
  CommPtr group_;
  bool sequence_parallel_;
  tp::VocabParallelEmbedding wte_{nullptr};
  torch::nn::Embedding wpe_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
  std::vector<dtrain::Sharded<TPGPTBlock>> block_calls_;  // FSDP units when sharded
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(TPGPT);

}  // namespace dtrain::models
