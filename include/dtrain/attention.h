// Causal self-attention as the GPTs compute it (models::GPT and the
// tensor-parallel models::TPGPT), apart from dtrain/models.h so that the
// parallel layers include nothing heavy.
//
// With dropout, the attention weights' mask is drawn for every head of the
// model, [B, heads, T, T], from the default generator, and a rank that
// computes only some heads (tensor parallelism) applies its heads' part: so
// one process holding all heads and a tp group holding them split drop the
// same weights, and a run's result does not depend on tp. Without dropout
// (or in evaluation) LibTorch's fused kernel runs.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace dtrain::models {

// Note [sequence context]
// Where a forward's tokens sit in their sequences. Without a context (the
// default) a model sees whole sequences: positions 0..T-1, attention among
// them. Context parallelism (dtrain/context_parallel.h) installs one around
// a training step: each rank then holds chunks of every sequence, and the
// models take their tokens' positions (sequence_positions) and their
// attention (causal_attention) from it, so a model that uses both runs on
// sequence shards unchanged. The context is process-wide, not per thread:
// on CUDA, backward (and activation checkpointing's recomputation in it)
// runs on autograd's device threads.
class SequenceContext {
 public:
  virtual ~SequenceContext() = default;
  // The positions in its sequence of each of the `local` tokens this rank
  // holds of every sequence: int64 [local], on `device`.
  virtual torch::Tensor positions(int64_t local, const torch::Device& device) const = 0;
  // The whole sequence's length when this rank holds `local` of its tokens.
  virtual int64_t whole_length(int64_t local) const = 0;
  // Causal attention of this rank's queries over the whole sequence's keys
  // and values (q, k, v: [B, h, local, head_dim], this rank's tokens).
  virtual torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) const = 0;
};
// nullptr: whole sequences again. The caller keeps `context` alive while installed.
void set_sequence_context(const SequenceContext* context);
const SequenceContext* sequence_context();

// Positions of a forward's T tokens: 0..T-1, or the installed context's.
torch::Tensor sequence_positions(int64_t T, const torch::Device& device);
// The length of the sequences a forward's T tokens belong to: T, or the
// installed context's whole length (for the models' checks against their context).
int64_t sequence_length(int64_t T);

// q, k, v: [B, h, T, head_dim], heads [first_head, first_head + h) of a
// model with `heads` heads. Returns [B, h, T, head_dim]. `dropout` in [0, 1):
// pass 0 in evaluation. Under a sequence context, its attention (which
// refuses dropout: the masks of one process's [T, T] weights are not drawn
// on shards).
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double dropout,
                               int64_t heads, int64_t first_head);

// torch::dropout of this rank's slice [start, start + x.size(dim)) along
// `dim` of a tensor of `full_shape`: the mask is drawn for the whole tensor,
// as one process would draw it, and sliced (sequence parallelism's dropout
// on sequence slices). The identity when not training or p == 0.
torch::Tensor dropout_of_slice(const torch::Tensor& x, double p, bool training, const std::vector<int64_t>& full_shape,
                               int64_t dim, int64_t start);

}  // namespace dtrain::models
