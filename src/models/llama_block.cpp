// The Llama block and its parts (include/dtrain/llama.h). Each computes what
// Hugging Face's modeling_llama.py computes, in the same order where the
// order changes rounding (RMSNorm in fp32, rotary tables in fp32).
#include "dtrain/llama.h"

#include <dtrain/attention.h>

#include "models/project.h"

#include <torch/nn/functional/activation.h>

namespace dtrain::models {

using detail::project;

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

void RMSNormImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  weight.fill_(1.0);
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const auto x32 = x.to(torch::kFloat);
  const auto normalized = x32 * torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normalized.to(x.scalar_type());
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) { return rms_norm(x, weight, eps_); }

std::pair<torch::Tensor, torch::Tensor> rotary_tables(int64_t T, int64_t head_dim, double theta,
                                                      const torch::Device& device) {
  return rotary_tables(torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(device)), head_dim, theta);
}

std::pair<torch::Tensor, torch::Tensor> rotary_tables(const torch::Tensor& positions, int64_t head_dim, double theta) {
  const torch::Device device = positions.device();
  const auto options = torch::TensorOptions().dtype(torch::kFloat).device(device);
  // theta^(-2i/head_dim) for i < head_dim/2, computed as Hugging Face does
  // (the exponent from int64 steps, in fp32).
  const auto exponents = torch::arange(0, head_dim, 2, options.dtype(torch::kLong)).to(torch::kFloat) /
                         static_cast<double>(head_dim);
  const auto inverse_frequencies = 1.0 / torch::pow(theta, exponents);
  const auto angles = torch::outer(positions.to(torch::kFloat), inverse_frequencies.to(device));  // [T, head_dim/2]
  const auto both_halves = torch::cat({angles, angles}, -1);                                  // [T, head_dim]
  return {both_halves.cos(), both_halves.sin()};
}

torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.to(x.scalar_type()) + rotated * sin.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& config) : config_(config) {
  const int64_t head_dim = config.dim / config.n_head;
  const auto linear = [](int64_t in, int64_t out) {
    return deferred(torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)));
  };
  q_proj_ = register_module("q_proj", linear(config.dim, config.n_head * head_dim));
  k_proj_ = register_module("k_proj", linear(config.dim, config.n_kv_head * head_dim));
  v_proj_ = register_module("v_proj", linear(config.dim, config.n_kv_head * head_dim));
  o_proj_ = register_module("o_proj", linear(config.n_head * head_dim, config.dim));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t heads = config_.n_head, kv_heads = config_.n_kv_head, head_dim = config_.dim / heads;
  auto q = rotate(project(q_proj_, x).view({B, T, heads, head_dim}).transpose(1, 2), cos, sin);
  auto k = rotate(project(k_proj_, x).view({B, T, kv_heads, head_dim}).transpose(1, 2), cos, sin);
  auto v = project(v_proj_, x).view({B, T, kv_heads, head_dim}).transpose(1, 2);
  if (kv_heads != heads) {
    // Query head h reads key/value head h / (heads / kv_heads).
    k = k.repeat_interleave(heads / kv_heads, 1);
    v = v.repeat_interleave(heads / kv_heads, 1);
  }
  const double dropout = is_training() ? config_.dropout : 0.0;
  auto y = causal_attention(q, k, v, dropout, heads, 0);  // [B,heads,T,head_dim]
  return project(o_proj_, y.transpose(1, 2).reshape({B, T, heads * head_dim}));
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& config) {
  const int64_t width = config.ffn_dim > 0 ? config.ffn_dim : default_ffn_dim(config.dim);
  const auto linear = [](int64_t in, int64_t out) {
    return deferred(torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false)));
  };
  gate_proj_ = register_module("gate_proj", linear(config.dim, width));
  up_proj_ = register_module("up_proj", linear(config.dim, width));
  down_proj_ = register_module("down_proj", linear(width, config.dim));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  return project(down_proj_, torch::silu(project(gate_proj_, x)) * project(up_proj_, x));
}

LlamaBlockImpl::LlamaBlockImpl(const LlamaConfig& config) : config_(config) {
  // Registered in forward order, under Hugging Face's names.
  input_layernorm_ = register_module("input_layernorm", deferred(RMSNorm(config.dim, config.rms_norm_eps)));
  self_attn_ = register_module("self_attn", LlamaAttention(config));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", deferred(RMSNorm(config.dim, config.rms_norm_eps)));
  mlp_ = register_module("mlp", LlamaMLP(config));
}

torch::Tensor LlamaBlockImpl::forward(torch::Tensor x) {
  // The tables are cheap next to the block (T x head_dim) and depend only on
  // T: computing them here keeps them out of the parameters and buffers.
  const auto [cos, sin] = rotary_tables(sequence_positions(x.size(1), x.device()), config_.dim / config_.n_head,
                                        config_.rope_theta);  // Note [sequence context]
  x = x + self_attn_->forward(input_layernorm_->forward(x), cos, sin);
  return x + mlp_->forward(post_attention_layernorm_->forward(x));
}

}  // namespace dtrain::models
