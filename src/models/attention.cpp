#include <dtrain/attention.h>

#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <limits>

namespace dtrain::models {
namespace {

// What torch::dropout multiplies by: a Bernoulli(1 - p) mask scaled by
// 1 / (1 - p), drawn for `shape` in one call (the same draws as dropout of
// a tensor of that shape).
torch::Tensor dropout_mask(const std::vector<int64_t>& shape, const torch::TensorOptions& options, double p) {
  return torch::empty(shape, options).bernoulli_(1 - p).div_(1 - p);
}

// Note [sequence context]: set by the trainer's thread, read by autograd's too.
std::atomic<const SequenceContext*> installed_context{nullptr};

}  // namespace

void set_sequence_context(const SequenceContext* context) { installed_context.store(context); }
const SequenceContext* sequence_context() { return installed_context.load(); }

torch::Tensor sequence_positions(int64_t T, const torch::Device& device) {
  if (const SequenceContext* context = sequence_context()) return context->positions(T, device);
  return torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(device));
}

int64_t sequence_length(int64_t T) {
  const SequenceContext* context = sequence_context();
  return context ? context->whole_length(T) : T;
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double dropout,
                               int64_t heads, int64_t first_head) {
  if (const SequenceContext* context = sequence_context()) {
    TORCH_CHECK(dropout == 0.0, "attention dropout (", dropout,
                ") cannot run on sequence shards (context parallelism): train with --dropout 0");
    return context->attention(q, k, v);
  }
  if (dropout == 0.0) {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, 0.0, /*is_causal=*/true);
  }
  const int64_t B = q.size(0), T = q.size(2);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  auto weights = torch::softmax(scores.masked_fill(future, -std::numeric_limits<double>::infinity()), -1);
  const auto mask = dropout_mask({B, heads, T, T}, weights.options(), dropout).narrow(1, first_head, q.size(1));
  return torch::matmul(weights * mask, v);
}

torch::Tensor dropout_of_slice(const torch::Tensor& x, double p, bool training, const std::vector<int64_t>& full_shape,
                               int64_t dim, int64_t start) {
  if (!training || p == 0.0) return x;
  return x * dropout_mask(full_shape, x.options(), p).narrow(dim, start, x.size(dim));
}

}  // namespace dtrain::models
