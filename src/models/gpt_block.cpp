#include "dtrain/models.h"

#include <dtrain/attention.h>

#include "models/project.h"

#include <vector>

namespace dtrain::models {

using detail::project;

GPTBlockImpl::GPTBlockImpl(const GPTConfig& config)
    : n_head_(config.n_head), dropout_(config.dropout), config_(config) {
  const int64_t C = config.n_embd;
  auto layer_norm = [&config] { return gpt_layer_norm(config); };
  // Registered in forward order (see CNNImpl for why).
  ln_1_ = register_module("ln_1", layer_norm());
  qkv_ = register_module("qkv", deferred(torch::nn::Linear(C, 3 * C)));  // one matmul for q, k and v
  attn_proj_ = register_module("attn_proj", deferred(torch::nn::Linear(C, C)));
  ln_2_ = register_module("ln_2", layer_norm());
  mlp_fc_ = register_module("mlp_fc", deferred(torch::nn::Linear(C, 4 * C)));
  mlp_proj_ = register_module("mlp_proj", deferred(torch::nn::Linear(4 * C, C)));
}

torch::Tensor GPTBlockImpl::forward(torch::Tensor x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  const double dropout = is_training() ? dropout_ : 0.0;

  // [B,T,3C] -> three [B,n_head,T,head_dim] tensors.
  auto qkv = project(qkv_, ln_1_->forward(x)).view({B, T, 3, n_head_, C / n_head_}).permute({2, 0, 3, 1, 4});
  // is_causal: position t attends to positions <= t only, which is what
  // makes the logits at t independent of later tokens.
  // With dropout, the weights' mask is drawn as TPGPT draws it (dtrain/attention.h).
  auto y = causal_attention(qkv[0], qkv[1], qkv[2], dropout, n_head_, 0);
  y = y.transpose(1, 2).reshape({B, T, C});
  x = x + torch::dropout(project(attn_proj_, y), dropout, is_training());

  auto h = gpt_activation(config_, project(mlp_fc_, ln_2_->forward(x)));
  return x + torch::dropout(project(mlp_proj_, h), dropout, is_training());
}

}  // namespace dtrain::models
