// Context parallelism (include/dtrain/context_parallel.h) at 1-4 ranks: the
// head-and-tail shards partition the sequence and balance the causal work;
// ring attention equals the shard of full causal attention, forward and
// backward (with the overlap on and off, fused kernels or matrix products,
// fp32 and bf16); and under a
// ContextParallel scope the GPT and Llama, fed their shards of every
// sequence, give the whole sequences' loss and gradients.
#include <dtrain/context_parallel.h>
#include <dtrain/llama.h>
#include <dtrain/models.h>

#include "../common/multirank_gtest.h"

#include <ATen/ops/scaled_dot_product_attention.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

using dtrain::testing::world;
using dtrain::testing::world_ptr;
namespace cp = dtrain::cp;

namespace {

double max_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat) - b.to(torch::kFloat)).abs().max().item<double>();
}

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double tolerance, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double error = max_difference(actual, expected);
  EXPECT_LE(error, tolerance * (1.0 + expected.abs().max().item<double>())) << what << ": max |difference| " << error;
}

// The sum of x over the world (gradients of a replicated parameter).
torch::Tensor summed(const torch::Tensor& x) {
  torch::Tensor sum = x.contiguous().clone();
  world().blocking().all_reduce(sum);
  return sum;
}

TEST(SequenceShards, HeadAndTailChunksPartitionTheSequence) {
  const int n = world().size(), r = world().rank();
  const int64_t T = 24 * n;
  const torch::Tensor tokens = torch::arange(T).view({1, T});
  const torch::Tensor mine = cp::shard_sequence(tokens, 1, n, r).view({-1});
  EXPECT_TRUE(mine.equal(cp::shard_positions(T, n, r, torch::kCPU)));
  const int64_t c = T / (2 * n);
  EXPECT_EQ(mine[0].item<int64_t>(), r * c);
  EXPECT_EQ(mine[c].item<int64_t>(), (2 * n - 1 - r) * c);
  // Every position once over the group.
  torch::Tensor all = torch::empty({T}, torch::kLong);
  world().blocking().all_gather(mine.contiguous(), all);
  EXPECT_TRUE(std::get<0>(all.sort()).equal(torch::arange(T)));
}

TEST(SequenceShards, CausalWorkIsEvenOnlyWithHeadsAndTails) {
  const int64_t T = 256;
  for (int n : {2, 4, 8}) {
    int64_t balanced_total = 0, plain_total = 0;
    for (int r = 0; r < n; ++r) {
      balanced_total += cp::causal_pairs(T, n, r, true);
      plain_total += cp::causal_pairs(T, n, r, false);
      EXPECT_EQ(cp::causal_pairs(T, n, r, true), cp::causal_pairs(T, n, 0, true)) << "cp " << n << " rank " << r;
    }
    EXPECT_EQ(balanced_total, T * (T + 1) / 2);
    EXPECT_EQ(plain_total, T * (T + 1) / 2);
    // Plain slices: the last rank's queries see all earlier keys, the first's almost none.
    const int64_t first = cp::causal_pairs(T, n, 0, false), last = cp::causal_pairs(T, n, n - 1, false);
    EXPECT_GT(last, (2 * n - 2) * first) << "cp " << n;
  }
}

TEST(SequenceShards, ASequenceThatDoesNotSplitIsRefusedWithTheFix) {
  try {
    cp::shard_sequence(torch::zeros({1, 10}), 1, 4, 0);
    ADD_FAILURE() << "10 tokens over cp 4 were accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--seq-len divisible by 8"), std::string::npos) << e.what();
  }
}

// Full causal attention on every rank (the same seed), against the ring on
// each rank's shard: the output and the gradients of q, k, v.
void check_ring_against_full(const cp::Ring& ring, torch::ScalarType dtype, double tolerance, int64_t kv_heads) {
  const int n = world().size(), r = world().rank();
  const int64_t B = 2, H = 4, T = 12 * n, D = 8;
  torch::manual_seed(7);
  const torch::Tensor q = torch::randn({B, H, T, D}).to(dtype).requires_grad_();
  const torch::Tensor k = torch::randn({B, kv_heads, T, D}).to(dtype).requires_grad_();
  const torch::Tensor v = torch::randn({B, kv_heads, T, D}).to(dtype).requires_grad_();
  const torch::Tensor weights = torch::randn({B, H, T, D}).to(dtype);  // of the loss sum(out * weights)
  const auto heads = [&](const torch::Tensor& x) { return x.repeat_interleave(H / kv_heads, 1); };
  const torch::Tensor full = at::scaled_dot_product_attention(q.to(torch::kFloat), heads(k).to(torch::kFloat),
                                                              heads(v).to(torch::kFloat), {}, 0.0, true);
  (full * weights.to(torch::kFloat)).sum().backward();

  const auto shard = [&](const torch::Tensor& x) { return cp::shard_sequence(x.detach(), 2, n, r).requires_grad_(); };
  const torch::Tensor q_mine = shard(q), k_mine = shard(k), v_mine = shard(v);
  const torch::Tensor out = cp::ring_attention(q_mine, heads(k_mine), heads(v_mine), ring);
  EXPECT_EQ(out.scalar_type(), dtype);
  (out * cp::shard_sequence(weights, 2, n, r)).sum().to(torch::kFloat).backward();
  const std::string what = std::string(dtype == torch::kBFloat16 ? "bf16" : "fp32") + ", " +
                           std::to_string(kv_heads) + " kv heads, rank " + std::to_string(r);
  expect_close(out, cp::shard_sequence(full, 2, n, r).to(dtype), tolerance, "output, " + what);
  expect_close(q_mine.grad(), cp::shard_sequence(q.grad(), 2, n, r), tolerance, "dq, " + what);
  expect_close(k_mine.grad(), cp::shard_sequence(k.grad(), 2, n, r), tolerance, "dk, " + what);
  expect_close(v_mine.grad(), cp::shard_sequence(v.grad(), 2, n, r), tolerance, "dv, " + what);
}

TEST(RingAttention, EqualsTheShardOfFullCausalAttentionForwardAndBackward) {
  const cp::Ring ring = cp::make_ring(world_ptr());
  check_ring_against_full(ring, torch::kFloat, 1e-5, 4);
  check_ring_against_full(ring, torch::kFloat, 1e-5, 2);  // grouped-query: k, v repeated per query head
}

TEST(RingAttention, WithoutOverlapTheSame) {
  check_ring_against_full(cp::make_ring(world_ptr(), /*overlap=*/false), torch::kFloat, 1e-5, 4);
}

TEST(RingAttention, WithMatrixProductBlocksTheSame) {
  // What other devices than the CPU run for now (Ring::fused).
  const cp::Ring ring = cp::make_ring(world_ptr(), /*overlap=*/true, /*fused=*/false);
  check_ring_against_full(ring, torch::kFloat, 1e-5, 2);
  check_ring_against_full(ring, torch::kBFloat16, 2e-2, 4);
}

TEST(RingAttention, InBf16AsFullAttentionInBf16) {
  // Blocks travel in bf16; the softmax statistics and sums stay fp32.
  check_ring_against_full(cp::make_ring(world_ptr()), torch::kBFloat16, 2e-2, 4);
}

// A model's loss (the mean over every position of every sequence) and its
// gradients from whole sequences on one rank, against cp: each rank's
// forward on its shard under the scope, its loss the mean over its tokens;
// the mean over ranks of those is the whole loss (equal shards), and the
// gradients' mean over ranks the whole gradients.
template <typename Model>
void check_model_on_shards(Model model, int64_t vocab, int64_t T, const std::string& what) {
  const int n = world().size(), r = world().rank();
  torch::manual_seed(3);
  const torch::Tensor tokens = torch::randint(vocab, {2, T}), targets = torch::randint(vocab, {2, T});
  const auto cross_entropy = [&](const torch::Tensor& logits, const torch::Tensor& t) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), t.reshape({-1}));
  };
  const torch::Tensor whole_loss = cross_entropy(model->forward(tokens), targets);
  whole_loss.backward();
  std::vector<torch::Tensor> whole_grads;
  for (const auto& p : model->parameters()) {
    whole_grads.push_back(p.grad().clone());
    p.mutable_grad().zero_();
  }
  cp::ContextParallel context(world_ptr());
  torch::Tensor loss;
  {
    cp::ContextParallel::Scope scope(context);
    loss = cross_entropy(model->forward(context.shard(tokens, 1)), context.shard(targets, 1));
    loss.backward();
  }
  EXPECT_EQ(dtrain::models::sequence_context(), nullptr) << "the scope restores whole sequences";
  expect_close(summed(loss.detach()) / n, whole_loss.detach(), 1e-5, what + " loss, rank " + std::to_string(r));
  const auto parameters = model->named_parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    expect_close(summed(parameters[i].value().grad()) / n, whole_grads[i], 1e-5,
                 what + " gradient of " + parameters[i].key() + ", rank " + std::to_string(r));
  }
}

TEST(ContextParallel, TheGPTOnShardsEqualsWholeSequences) {
  dtrain::models::GPTConfig config;
  config.vocab_size = 40;
  config.seq_len = 8 * world().size();
  config.n_layer = 2;
  config.n_embd = 32;
  config.n_head = 4;
  torch::manual_seed(1);
  check_model_on_shards(dtrain::models::GPT(config), config.vocab_size, config.seq_len, "GPT");  // learned positions
}

TEST(ContextParallel, LlamaOnShardsEqualsWholeSequences) {
  dtrain::models::LlamaConfig config;
  config.vocab_size = 40;
  config.seq_len = 8 * world().size();
  config.n_layer = 2;
  config.dim = 32;
  config.n_head = 4;
  config.n_kv_head = 2;
  config.ffn_dim = 48;
  torch::manual_seed(1);
  check_model_on_shards(dtrain::models::Llama(config), config.vocab_size, config.seq_len, "Llama");  // rotary, GQA
}

TEST(ContextParallel, AttentionDropoutIsRefusedOnShards) {
  cp::ContextParallel context(world_ptr());
  cp::ContextParallel::Scope scope(context);
  const torch::Tensor q = torch::randn({1, 2, 4, 8});
  EXPECT_THROW(dtrain::models::causal_attention(q, q, q, 0.1, 2, 0), c10::Error);
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
