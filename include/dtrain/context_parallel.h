// Context parallelism: every sequence split over the ranks of a cp group, so
// that attention's activations, which grow with the sequence, fall as 1/cp
// per rank. The parameters are replicated over cp (a data-parallel engine
// reduces the gradients over dp x cp).
//
// Causal load balancing: a sequence of T tokens is cut into 2·cp equal
// chunks and rank r holds chunks r and 2·cp-1-r (a head and a tail), so
// every rank's queries see equally many keys: the causal work is even, where
// plain slices would give the last rank cp times the first's
// (causal_pairs says how many (query, key) pairs a rank computes).
//
// Attention runs as ring attention: each rank's keys and values pass around
// the group, one hop per step, while the rank computes its queries against
// the block in hand; the blocks' partial results merge with an online
// softmax (a running log-sum-exp). Backward passes the blocks around again,
// each with its gradient accumulating on the way back to its owner.
//
//   dtrain::cp::ContextParallel cp(mesh.comm("cp"));     // collective
//   {
//     dtrain::cp::ContextParallel::Scope in_scope(cp);   // Note [sequence context]
//     auto logits = model->forward(cp.shard(tokens, 1)); // [B, T / cp, V]
//     loss(logits, cp.shard(targets, 1)).backward();
//   }
#pragma once

#include <dtrain/attention.h>
#include <dtrain/comm.h>

#include <torch/types.h>

#include <cstdint>

namespace dtrain::cp {

// The elements along `dim` (T of them, a multiple of 2·size) that rank
// `rank` of `size` holds: chunks rank and 2·size-1-rank of 2·size,
// concatenated. Throws std::invalid_argument naming T and the divisor.
torch::Tensor shard_sequence(const torch::Tensor& x, int64_t dim, int size, int rank);
// The positions (int64 [T / size]) of those elements in the sequence.
torch::Tensor shard_positions(int64_t T, int size, int rank, const torch::Device& device);
// The (query, key) pairs of a causal [T, T] attention that rank `rank` of
// `size` computes: with `balanced`, of its head-and-tail chunks; otherwise
// of plain consecutive slices of T / size.
int64_t causal_pairs(int64_t T, int size, int rank, bool balanced);

// The two communicators a ring uses (splits of the cp group): keys and
// values travel on one, their gradients on the other, so each is a FIFO
// that every rank issues in the same order.
struct Ring {
  CommPtr group, blocks, gradients;
  bool overlap = true;  // false: wait for each block before computing (to measure the exposed time)
  // Each (query chunk, key chunk) pair runs a kernel that holds no [c, c]
  // scores (c = T / (2 cp)): LibTorch's flash kernel on the CPU, the
  // memory-efficient one on CUDA (src/cp/pair_attention.h); false, and on
  // other devices, matrix products over the pair's scores in fp32.
  bool fused = true;
};
// Collective over `group`.
Ring make_ring(CommPtr group, bool overlap = true, bool fused = true);

// Causal attention of this rank's queries over the keys and values of every
// rank of the ring, each holding its shard_sequence of T = size · local
// tokens. q, k, v: [B, h, local, head_dim] (k and v with q's heads);
// returns [B, h, local, head_dim] in q's dtype, equal to the shard of full
// causal attention over the T tokens. The merge's statistics and the
// gradient sums are fp32; with bf16 inputs a fused pair's own result is
// rounded to bf16 before the merge (up to 2 cp - 1 roundings). Differentiable (its backward is collective over the ring
// too). Collective over ring.group.
torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const Ring& ring);

// A cp group as a sequence context (Note [sequence context]): while a Scope
// lives, the models' positions are this rank's shard's and their attention
// is ring attention.
class ContextParallel final : public models::SequenceContext {
 public:
  // Collective over `group`.
  explicit ContextParallel(CommPtr group, bool overlap = true);
  int size() const { return ring_.group->size(); }
  int rank() const { return ring_.group->rank(); }
  const CommPtr& group() const { return ring_.group; }
  // This rank's shard of x along `dim` (shard_sequence).
  torch::Tensor shard(const torch::Tensor& x, int64_t dim) const { return shard_sequence(x, dim, size(), rank()); }

  torch::Tensor positions(int64_t local, const torch::Device& device) const override;
  int64_t whole_length(int64_t local) const override { return local * size(); }
  torch::Tensor attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) const override;

  // Installs the context for its lifetime (and restores the previous one).
  class Scope {
   public:
    explicit Scope(const ContextParallel& context);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    const models::SequenceContext* previous_;
  };

 private:
  Ring ring_;
};

}  // namespace dtrain::cp
