// Context parallelism in a model's description (include/dtrain/plan.h:
// describe_tp_gpt and describe_llama with cp > 1): the model is described at
// the tokens one rank holds, T / cp of each sequence, and this adds what ring
// attention (src/cp/ring_attention.cpp) holds and sends besides.
//
// Note [ring attention plan]
// - Kept for backward, per block: q, k, v, the output and the log-sum-exp,
//   as the local flash kernel keeps them, except that the output is the
//   fp32 running result; in another compute dtype the block's output
//   projection keeps its cast copy too.
// - During a block's backward, per local token and attention width W: dq and
//   (in another compute dtype) the incoming gradient in fp32, the (k, v)
//   block in hand and the next one in the compute dtype, four fp32 (dk, dv)
//   sums (the block's, the one on its way on, the one received from the
//   rank before, and the next receive's buffer, allocated while that one is
//   still held), and one pair's (dq, dk, dv) over half the tokens (with fp32
//   copies in another dtype). The ring's backward runs after the MLP's has
//   freed the MLP's activations, so the block's backward peaks at the larger
//   of its other workspace and the ring's less what the MLP freed (measured
//   against planned: 0.98-1.04, tests/plan/test_plan_llama.cpp; counting
//   the ring's on top of everything planned 0.94-0.96 for pipeline stages).
// - Sent per block and step: the (k, v) block cp - 1 times forward and again
//   in backward, in the compute dtype, and the (dk, dv) sums cp times in
//   fp32 (the last brings each block's sum home).
// tests/plan/test_plan_llama.cpp checks the whole against the allocator.
#include "plan/plan_internal.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dtrain::plan::detail {

void add_ring_attention(ModelSpec& model, int cp, int64_t local_tokens, int64_t width, int64_t compute_bytes,
                        int64_t mlp_bytes_per_token) {
  if (cp <= 1) return;
  const int64_t e = compute_bytes, per_width = local_tokens * width;
  const bool cast = e != kFloatBytes;
  const int64_t ring = per_width * (kFloatBytes + (cast ? kFloatBytes : 0) + 4 * e + 8 * kFloatBytes) +
                       per_width * 3 / 2 * (e + (cast ? kFloatBytes : 0));
  const int64_t freed = local_tokens * mlp_bytes_per_token;
  int64_t blocks = 0;
  for (size_t u = 1; u < model.units.size(); ++u) {
    UnitSpec& block = model.units[u];
    ++blocks;
    if (cast) block.activation_bytes += per_width * kFloatBytes;
    block.backward_workspace_bytes = std::max(block.backward_workspace_bytes, ring - freed);
  }
  add_ring_sends(model, cp, blocks, local_tokens, width, compute_bytes);
}

void add_ring_sends(ModelSpec& model, int cp, int64_t block_passes, int64_t local_tokens, int64_t width,
                    int64_t compute_bytes) {
  if (cp <= 1) return;
  const int64_t per_width = local_tokens * width;
  const int64_t kv_block = 2 * per_width * compute_bytes, gradient_block = 2 * per_width * kFloatBytes;
  const int64_t kv_sends = 2 * block_passes * (cp - 1), gradient_sends = block_passes * cp;
  model.collectives.push_back({"send", "keys and values, context parallel", cp, kv_sends, kv_sends * kv_block, 0});
  model.collectives.push_back(
      {"send", "k/v gradients, context parallel", cp, gradient_sends, gradient_sends * gradient_block, 0});
}

int64_t context_parallel_tokens(int64_t seq_len, int cp) {
  if (seq_len % (2 * cp) != 0)
    throw std::invalid_argument("plan: context parallelism over " + std::to_string(cp) + " ranks needs seq_len " +
                                std::to_string(seq_len) + " divisible by " + std::to_string(2 * cp));
  return seq_len / cp;
}

}  // namespace dtrain::plan::detail
