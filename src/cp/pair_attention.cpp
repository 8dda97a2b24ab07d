// cp::pair_forward and cp::pair_backward (src/cp/pair_attention.h).
#include "cp/pair_attention.h"

#include <ATen/ops/_scaled_dot_product_efficient_attention.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_backward.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <torch/torch.h>

#include <limits>

namespace dtrain::cp {
namespace {

// Scores of one pair, fp32, the future masked on the diagonal.
torch::Tensor scores(const torch::Tensor& q, const torch::Tensor& k, Pairs pairs, double scale) {
  torch::Tensor s = torch::matmul(q, k.transpose(-2, -1)) * scale;
  if (pairs == Pairs::Diagonal) {
    const int64_t c = q.size(-2);
    const auto future = torch::ones({c, c}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
    s.masked_fill_(future, -std::numeric_limits<double>::infinity());
  }
  return s;
}

// The memory-efficient kernel's log-sum-exp layout: [B, h, queries rounded
// up to 32] (its forward returns it so, and its backward reads it so).
constexpr int64_t kCudaLseAlignment = 32;

// Padded with +inf, as the kernel's forward pads it (its backward relies on
// that instead of bound checks).
torch::Tensor padded_lse(const torch::Tensor& lse) {
  const int64_t c = lse.size(-1), padded = (c + kCudaLseAlignment - 1) / kCudaLseAlignment * kCudaLseAlignment;
  if (padded == c) return lse.contiguous();
  torch::Tensor out =
      torch::full({lse.size(0), lse.size(1), padded}, std::numeric_limits<float>::infinity(), lse.options());
  out.narrow(-1, 0, c).copy_(lse);
  return out;
}

// [B, h, c, d] laid out as [B, c, h, d] in memory: the kernel's backward
// views its output and the output's gradient so, and steps between their
// rows by h x d whatever their strides say.
torch::Tensor token_major(const torch::Tensor& x) { return x.transpose(1, 2).contiguous().transpose(1, 2); }

}  // namespace

PairKernel pair_kernel(bool fused, const torch::Tensor& q) {
  if (!fused) return PairKernel::MatrixProducts;
  if (q.device().is_cpu()) return PairKernel::CpuFlash;
  // The memory-efficient kernels: fp32, and the half types with head_dim a
  // multiple of 8 (their aligned variants; sdpa's own checks are skipped
  // when the kernel is called directly).
  const auto dtype = q.scalar_type();
  const bool half = dtype == torch::kBFloat16 || dtype == torch::kHalf;
  if (q.device().is_cuda() && (dtype == torch::kFloat || (half && q.size(-1) % 8 == 0)))
    return PairKernel::CudaEfficient;
  return PairKernel::MatrixProducts;
}

Partial pair_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, Pairs pairs, double scale,
                     PairKernel kernel) {
  const bool causal = pairs == Pairs::Diagonal;  // the diagonal pair's mask is the top-left triangle
  if (kernel == PairKernel::CpuFlash) {
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q.contiguous(), k.contiguous(), v.contiguous(),
                                                                      0.0, causal, {}, scale);
    return {out.to(torch::kFloat), lse.to(torch::kFloat)};
  }
  if (kernel == PairKernel::CudaEfficient) {
    auto [out, lse, seed, offset] = at::_scaled_dot_product_efficient_attention(
        q.contiguous(), k.contiguous(), v.contiguous(), std::nullopt, /*compute_log_sumexp=*/true, 0.0, causal, scale);
    return {out.to(torch::kFloat), lse.narrow(-1, 0, q.size(-2)).to(torch::kFloat)};
  }
  const torch::Tensor s = scores(q.to(torch::kFloat), k.to(torch::kFloat), pairs, scale);
  const torch::Tensor lse = torch::logsumexp(s, -1);
  return {torch::matmul(torch::exp(s - lse.unsqueeze(-1)), v.to(torch::kFloat)), lse};
}

PairGradients pair_backward(const torch::Tensor& dout, const torch::Tensor& q, const torch::Tensor& k,
                            const torch::Tensor& v, const torch::Tensor& out, const torch::Tensor& lse, Pairs pairs,
                            double scale, PairKernel kernel) {
  const bool causal = pairs == Pairs::Diagonal;
  const auto dtype = q.scalar_type();
  if (kernel == PairKernel::CpuFlash) {
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        dout.to(dtype).contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), out.to(dtype).contiguous(),
        lse.contiguous(), 0.0, causal, {}, scale);
    return {dq.to(torch::kFloat), dk.to(torch::kFloat), dv.to(torch::kFloat)};
  }
  if (kernel == PairKernel::CudaEfficient) {
    // No dropout: the generator's seed and offset are not read.
    const torch::Tensor unused = torch::zeros({}, q.options().dtype(torch::kLong));
    auto [dq, dk, dv, dbias] = at::_scaled_dot_product_efficient_attention_backward(
        token_major(dout.to(dtype)), q.contiguous(), k.contiguous(), v.contiguous(), torch::Tensor(),
        token_major(out.to(dtype)), padded_lse(lse), unused, unused, 0.0, {true, true, true, false}, causal, scale);
    return {dq.to(torch::kFloat), dk.to(torch::kFloat), dv.to(torch::kFloat)};
  }
  const torch::Tensor q32 = q.to(torch::kFloat), k32 = k.to(torch::kFloat), v32 = v.to(torch::kFloat);
  const torch::Tensor p = torch::exp(scores(q32, k32, pairs, scale) - lse.unsqueeze(-1));
  const torch::Tensor dp = torch::matmul(dout, v32.transpose(-2, -1));
  const torch::Tensor ds = p * (dp - (dout * out).sum(-1, /*keepdim=*/true)) * scale;
  return {torch::matmul(ds, k32), torch::matmul(ds.transpose(-2, -1), q32), torch::matmul(p.transpose(-2, -1), dout)};
}

}  // namespace dtrain::cp
