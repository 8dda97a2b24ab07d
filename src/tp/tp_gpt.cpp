// GPT with tensor-parallel blocks (dtrain/tp_gpt.h).
#include "dtrain/tp_gpt.h"

#include <dtrain/attention.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::models {

void check_tensor_parallel(const GPTConfig& config, int tp) {
  if (tp < 1) throw std::invalid_argument("tensor parallelism: tp must be >= 1, got " + std::to_string(tp));
  if (config.n_head % tp != 0)
    throw std::invalid_argument("tensor parallelism: tp " + std::to_string(tp) + " does not divide the " +
                                std::to_string(config.n_head) + " attention heads (each rank computes whole heads)");
  if (config.vocab_size % tp != 0)
    throw std::invalid_argument("tensor parallelism: tp " + std::to_string(tp) + " does not divide the vocabulary of " +
                                std::to_string(config.vocab_size) + " tokens (each rank holds vocab / tp rows)");
}

TPGPTBlockImpl::TPGPTBlockImpl(const GPTConfig& config, CommPtr group)
    : group_(group), local_heads_(config.n_head / group->size()), dropout_(config.dropout), config_(config) {
  check_tensor_parallel(config, group->size());
  const int64_t C = config.n_embd;
  auto layer_norm = [&config] { return gpt_layer_norm(config); };
  // GPTBlock's names and order.
  ln_1_ = register_module("ln_1", layer_norm());
  qkv_ = register_module("qkv", deferred(tp::ColumnParallelLinear(C, 3 * C, group,
                                                                  tp::ColumnParallelLinearOptions{.sections = 3})));
  attn_proj_ = register_module("attn_proj", deferred(tp::RowParallelLinear(C, C, group)));
  ln_2_ = register_module("ln_2", layer_norm());
  mlp_fc_ = register_module("mlp_fc", deferred(tp::ColumnParallelLinear(C, 4 * C, group)));
  mlp_proj_ = register_module("mlp_proj", deferred(tp::RowParallelLinear(4 * C, C, group)));
}

// This rank's heads of causal self-attention on [B,T,C] (whole sequences):
// [B,T,C/tp] ready for the row-parallel projection.
torch::Tensor TPGPTBlockImpl::attention(const torch::Tensor& h, int64_t B, int64_t T) {
  const double dropout = is_training() ? dropout_ : 0.0;
  const int64_t local_C = qkv_->weight.size(0) / 3;  // this rank's heads x head_dim
  // [B,T,3*local_C] -> q, k, v [B,local_heads,T,head_dim].
  auto qkv = h.view({B, T, 3, local_heads_, local_C / local_heads_}).permute({2, 0, 3, 1, 4});
  // With dropout, the mask of every head is drawn and this rank's heads' part
  // applied: the same weights dropped as in models::GPT (dtrain/attention.h).
  auto y = models::causal_attention(qkv[0], qkv[1], qkv[2], dropout, local_heads_ * group_->size(),
                                    group_->rank() * local_heads_);
  return y.transpose(1, 2).reshape({B, T, local_C});
}

torch::Tensor slice_layer_norm(const torch::nn::LayerNorm& norm, const torch::Tensor& x, const CommPtr& group) {
  return torch::layer_norm(x, norm->options.normalized_shape(), tp::copy_to_group(norm->weight, group),
                           tp::copy_to_group(norm->bias, group), norm->options.eps());
}

torch::Tensor TPGPTBlockImpl::forward(torch::Tensor x) {
  const bool training = is_training();
  if (!sequence_parallel_) {
    const int64_t B = x.size(0), T = x.size(1);
    x = x + torch::dropout(attn_proj_->forward(attention(qkv_->forward(ln_1_->forward(x)), B, T)), dropout_, training);
    auto h = models::gpt_activation(config_, mlp_fc_->forward(ln_2_->forward(x)));
    return x + torch::dropout(mlp_proj_->forward(h), dropout_, training);
  }
  // x: this rank's sequence slice [B,T/tp,C]; attention and the MLP see whole sequences.
  const int64_t B = x.size(0), T = x.size(1) * group_->size();
  // Dropout on the sequence slice: the whole [B,T,C] mask drawn, this slice's part applied.
  const std::vector<int64_t> whole{B, T, x.size(2)};
  const int64_t first = group_->rank() * x.size(1);
  auto h = qkv_->forward_gathered(tp::gather_sequence(slice_layer_norm(ln_1_, x, group_), group_));
  x = x + models::dropout_of_slice(attn_proj_->forward_sequence_parallel(attention(h, B, T)), dropout_, training, whole,
                                   1, first);
  h = models::gpt_activation(config_, mlp_fc_->forward_gathered(tp::gather_sequence(slice_layer_norm(ln_2_, x, group_), group_)));
  return x + models::dropout_of_slice(mlp_proj_->forward_sequence_parallel(h), dropout_, training, whole, 1, first);
}

TPGPTImpl::TPGPTImpl(const GPTConfig& config, CommPtr group, bool sequence_parallel)
    : config_(config), group_(std::move(group)), sequence_parallel_(sequence_parallel) {
  GPTImpl::parameter_count(config_);  // GPT's own checks of the config
  check_tensor_parallel(config_, group_->size());
  wte_ = register_module("wte", deferred(tp::VocabParallelEmbedding(config_.vocab_size, config_.n_embd, group_)));
  wpe_ = register_module("wpe", deferred(torch::nn::Embedding(config_.seq_len, config_.n_embd)));
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    block_calls_.emplace_back(TPGPTBlock(config_, group_).ptr());
    blocks_->push_back(block_calls_.back());
  }
  ln_f_ = register_module(
      "ln_f", gpt_layer_norm(config_));
  initialize_unless_deferred(*this);
}

void TPGPTImpl::init_module(const std::string& /*name*/, torch::nn::Module& module, at::Generator& generator) {
  init_tp_gpt_module(module, generator);
}

void init_tp_gpt_module(torch::nn::Module& module, at::Generator& generator) {
  torch::NoGradGuard no_grad;
  // GPT-2's N(0, 0.02) for every weight matrix, biases 0: drawn at full size
  // from the module's generator exactly as GPTImpl::init_module draws them.
  auto full_normal = [&generator](std::vector<int64_t> shape) {
    return torch::empty(shape).normal_(0.0, 0.02, generator);
  };
  if (auto* column = module.as<tp::ColumnParallelLinear>()) {
    column->load_full(full_normal({column->out_features(), column->in_features()}),
                      torch::zeros({column->out_features()}));
  } else if (auto* row = module.as<tp::RowParallelLinear>()) {
    row->load_full(full_normal({row->out_features(), row->in_features()}), torch::zeros({row->out_features()}));
  } else if (auto* embedding = module.as<tp::VocabParallelEmbedding>()) {
    embedding->load_full(full_normal({embedding->vocab_size(), embedding->dim()}));
  } else if (auto* plain = module.as<torch::nn::Embedding>()) {
    plain->weight.normal_(0.0, 0.02, generator);
  } else {
    default_init(module, generator);
  }
}

torch::Tensor TPGPTImpl::forward(torch::Tensor tokens) {
  check_materialized(wte_->weight, "TPGPT");
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
              "TPGPT: expected int64 tokens of shape [B,T], got ", tokens.scalar_type(), " ", tokens.sizes());
  const int64_t T = tokens.size(1);
  TORCH_CHECK(models::sequence_length(T) <= config_.seq_len, "TPGPT: sequence of ", models::sequence_length(T), " tokens is longer than seq_len ", config_.seq_len);
  // The blocks keep the layout until the next forward: a recomputation in
  // backward (activation checkpointing) must see the same one.
  const bool sequence_parallel = sequence_parallel_ && group_->size() > 1 && T % group_->size() == 0;
  for (auto& block : block_calls_) block->set_sequence_parallel(sequence_parallel);
  if (sequence_parallel) return forward_sequence_parallel(tokens);
  auto positions = models::sequence_positions(T, tokens.device());  // Note [sequence context]
  auto x = wte_->forward(tokens) + wpe_->forward(positions);
  x = torch::dropout(x, config_.dropout, is_training());
  for (auto& block : block_calls_) x = block(x);
  x = ln_f_->forward(x);
  // The tied head, column-parallel over the vocabulary: this rank's rows of wte.
  return tp::copy_to_group(x, group_).matmul(wte_->weight.t());
}

torch::Tensor TPGPTImpl::forward_sequence_parallel(const torch::Tensor& tokens) {
  const int64_t T = tokens.size(1), slice = T / group_->size(), first = group_->rank() * slice;
  auto positions = models::sequence_positions(T, tokens.device()).narrow(0, first, slice);
  // The embeddings' sum, this rank's sequence slice: the vocabulary rows'
  // partial lookups reduce-scattered, plus the slice's positions (wpe through
  // copy_to_group: each rank sees only its positions).
  auto x = tp::reduce_scatter_sequence(wte_->partial(tokens), group_) +
           torch::embedding(tp::copy_to_group(wpe_->weight, group_), positions);
  x = models::dropout_of_slice(x, config_.dropout, is_training(), {tokens.size(0), T, config_.n_embd}, 1, first);
  for (auto& block : block_calls_) x = block(x);
  x = slice_layer_norm(ln_f_, x, group_);
  // The tied head over whole sequences; gather_sequence's backward sums the
  // ranks' vocabulary slices' contributions, as copy_to_group does.
  return tp::gather_sequence(x, group_).matmul(wte_->weight.t());
}

torch::Tensor TPGPTImpl::loss(const torch::Tensor& logits_slice, const torch::Tensor& targets) const {
  return tp::vocab_parallel_cross_entropy(logits_slice.reshape({-1, logits_slice.size(-1)}), targets.reshape({-1}),
                                          group_);
}

}  // namespace dtrain::models
