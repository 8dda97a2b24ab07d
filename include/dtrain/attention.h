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

// q, k, v: [B, h, T, head_dim], heads [first_head, first_head + h) of a
// model with `heads` heads. Returns [B, h, T, head_dim]. `dropout` in [0, 1):
// pass 0 in evaluation.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double dropout,
                               int64_t heads, int64_t first_head);

// torch::dropout of this rank's slice [start, start + x.size(dim)) along
// `dim` of a tensor of `full_shape`: the mask is drawn for the whole tensor,
// as one process would draw it, and sliced (sequence parallelism's dropout
// on sequence slices). The identity when not training or p == 0.
torch::Tensor dropout_of_slice(const torch::Tensor& x, double p, bool training, const std::vector<int64_t>& full_shape,
                               int64_t dim, int64_t start);

}  // namespace dtrain::models
