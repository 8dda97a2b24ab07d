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
//   the incoming gradient in fp32, the (k, v) block in hand and the next one
//   in the compute dtype, and the block's fp32 (dk, dv) sum with the one
//   received from the rank before and the one on its way on. All counted
//   live at once on top of the block's activations: an upper bound, since
//   the block's MLP backward has freed the MLP's activations by the time the
//   ring's runs (measured/planned 0.96-1.02 at 128 tokens per rank,
//   0.91-0.97 at 256-512; crediting the whole overlap gives 1.01-1.05 at
//   128, under the measured peak).
// - Sent per block and step: the (k, v) block cp - 1 times forward and again
//   in backward, in the compute dtype, and the (dk, dv) sums cp times in
//   fp32 (the last brings each block's sum home).
// tests/plan/test_plan_llama.cpp checks the whole against the allocator.
#include "plan/plan_internal.h"

#include <stdexcept>
#include <string>

namespace dtrain::plan::detail {

void add_ring_attention(ModelSpec& model, int cp, int64_t local_tokens, int64_t width, int64_t compute_bytes) {
  if (cp <= 1) return;
  const int64_t e = compute_bytes, per_width = local_tokens * width;
  int64_t blocks = 0;
  for (size_t u = 1; u < model.units.size(); ++u) {
    UnitSpec& block = model.units[u];
    ++blocks;
    if (e != kFloatBytes) block.activation_bytes += per_width * kFloatBytes;
    block.backward_workspace_bytes +=
        per_width * (kFloatBytes + (e != kFloatBytes ? kFloatBytes : 0) + 4 * e + 6 * kFloatBytes);
  }
  const int64_t kv_block = 2 * per_width * e, gradient_block = 2 * per_width * kFloatBytes;
  const std::string what = "keys and values, context parallel";
  model.collectives.push_back({"send", what, cp, 2 * blocks * (cp - 1), 2 * blocks * (cp - 1) * kv_block, 0});
  model.collectives.push_back(
      {"send", "k/v gradients, context parallel", cp, blocks * cp, blocks * cp * gradient_block, 0});
}

int64_t context_parallel_tokens(int64_t seq_len, int cp) {
  if (seq_len % (2 * cp) != 0)
    throw std::invalid_argument("plan: context parallelism over " + std::to_string(cp) + " ranks needs seq_len " +
                                std::to_string(seq_len) + " divisible by " + std::to_string(2 * cp));
  return seq_len / cp;
}

}  // namespace dtrain::plan::detail
