// Llama with tensor-parallel blocks (dtrain/tp_llama.h).
#include "dtrain/tp_llama.h"

#include <dtrain/attention.h>

#include <torch/nn/functional/linear.h>

#include <stdexcept>
#include <string>

namespace dtrain::models {

// Note [replicated key/value heads]
// Grouped-query attention has fewer key/value heads than query heads, and a
// tensor-parallel group can be larger than their number (Llama 3 8B: 8 kv
// heads; tp 16, or kv 2 at tp 4 in the tests). When tp divides n_kv_head,
// k_proj and v_proj split as q_proj does: rank r's query heads read exactly
// kv heads [r kv/tp, (r+1) kv/tp), so each rank holds those rows. Otherwise
// every rank holds k_proj and v_proj whole, computes every kv head and keeps
// those its query heads read. We chose whole copies over Megatron's refusal
// (it requires tp | kv) and over vLLM-style per-rank single kv heads, because
// a whole copy keeps every parameter either a slice or replicated, which is
// what checkpoints across meshes, FSDP over dp and clipping (1/tp for a
// replicated parameter) already handle; a head held by some ranks only would
// need a third kind in all three. The cost, per rank: each whole projection
// is kv/n_head of the whole q_proj, so the two are 2 kv tp/n_head times this
// rank's q_proj slice (kv 2, n_head 8, tp 4: twice it; Llama 3 8B at tp 16:
// eight times, about 40% of a rank's block parameters), their compute, and
// per block and backward one all-reduce of both weights' gradients: a rank's
// kv gradient covers only its query heads' use of them, so the weights enter
// through copy_to_group and their gradients are summed over the group, as a
// replicated parameter's must be. tp above n_kv_head is thus for models
// whose kv projections are small next to the rest of a block.

void check_tensor_parallel(const LlamaConfig& config, int tp) {
  if (tp < 1) throw std::invalid_argument("tensor parallelism: tp must be >= 1, got " + std::to_string(tp));
  if (config.n_head % tp != 0)
    throw std::invalid_argument("tensor parallelism: tp " + std::to_string(tp) + " does not divide the " +
                                std::to_string(config.n_head) + " query heads (each rank computes whole heads)");
  if (config.vocab_size % tp != 0)
    throw std::invalid_argument("tensor parallelism: tp " + std::to_string(tp) + " does not divide the vocabulary of " +
                                std::to_string(config.vocab_size) + " tokens (each rank holds vocab / tp rows)");
}

bool splits_kv_heads(const LlamaConfig& config, int tp) { return config.n_kv_head % tp == 0; }

namespace {

tp::ColumnParallelLinear column(int64_t in, int64_t out, const CommPtr& group) {
  return deferred(tp::ColumnParallelLinear(in, out, group, tp::ColumnParallelLinearOptions{.bias = false}));
}

tp::RowParallelLinear row(int64_t in, int64_t out, const CommPtr& group) {
  return deferred(tp::RowParallelLinear(in, out, group, tp::RowParallelLinearOptions{.bias = false}));
}

// A replicated parameter used on a rank's part of the work: its gradient
// summed over the group.
torch::Tensor whole_linear(const torch::Tensor& h, const torch::nn::Linear& linear, const CommPtr& group) {
  return torch::nn::functional::linear(h, tp::copy_to_group(linear->weight, group));
}

}  // namespace

TPLlamaAttentionImpl::TPLlamaAttentionImpl(const LlamaConfig& config, CommPtr group)
    : config_(config), group_(std::move(group)), local_heads_(config.n_head / group_->size()) {
  check_tensor_parallel(config_, group_->size());
  const int64_t head_dim = config.dim / config.n_head, kv_width = config.n_kv_head * head_dim;
  // Llama's names and order.
  q_proj_ = register_module("q_proj", column(config.dim, config.n_head * head_dim, group_));
  if (splits_kv_heads(config_, group_->size())) {
    k_split_ = register_module("k_proj", column(config.dim, kv_width, group_));
    v_split_ = register_module("v_proj", column(config.dim, kv_width, group_));
  } else {
    const auto whole = [&] {
      return deferred(torch::nn::Linear(torch::nn::LinearOptions(config.dim, kv_width).bias(false)));
    };
    k_whole_ = register_module("k_proj", whole());
    v_whole_ = register_module("v_proj", whole());
  }
  o_proj_ = register_module("o_proj", row(config.n_head * head_dim, config.dim, group_));
}

torch::Tensor TPLlamaAttentionImpl::forward(const torch::Tensor& h, const torch::Tensor& cos, const torch::Tensor& sin,
                                            bool sequence_parallel) {
  const int64_t B = h.size(0), T = h.size(1);
  const int64_t heads = config_.n_head, head_dim = config_.dim / heads, first_head = group_->rank() * local_heads_;
  const auto split_heads = [&](const torch::Tensor& y, int64_t count) {
    return y.view({B, T, count, head_dim}).transpose(1, 2);  // [B,count,T,head_dim]
  };
  auto q = rotate(split_heads(q_proj_->forward_gathered(h), local_heads_), cos, sin);
  torch::Tensor k, v;
  if (k_split_) {
    const int64_t local_kv = config_.n_kv_head / group_->size();
    k = split_heads(k_split_->forward_gathered(h), local_kv);
    v = split_heads(v_split_->forward_gathered(h), local_kv);
    if (local_kv != local_heads_) {
      k = k.repeat_interleave(local_heads_ / local_kv, 1);
      v = v.repeat_interleave(local_heads_ / local_kv, 1);
    }
  } else {
    // Every kv head, then those this rank's query heads read (query head g
    // reads kv head g / (heads / kv)).
    const int64_t group_size = heads / config_.n_kv_head;
    k = split_heads(whole_linear(h, k_whole_, group_), config_.n_kv_head)
            .repeat_interleave(group_size, 1)
            .narrow(1, first_head, local_heads_);
    v = split_heads(whole_linear(h, v_whole_, group_), config_.n_kv_head)
            .repeat_interleave(group_size, 1)
            .narrow(1, first_head, local_heads_);
  }
  k = rotate(k, cos, sin);
  const double dropout = is_training() ? config_.dropout : 0.0;
  // With dropout, every head's mask is drawn and this rank's heads' part
  // applied, as in Llama (dtrain/attention.h).
  auto y = causal_attention(q, k, v, dropout, heads, first_head).transpose(1, 2).reshape({B, T, local_heads_ * head_dim});
  return sequence_parallel ? o_proj_->forward_sequence_parallel(y) : o_proj_->forward(y);
}

TPLlamaMLPImpl::TPLlamaMLPImpl(const LlamaConfig& config, CommPtr group) {
  const int64_t width = config.ffn_dim > 0 ? config.ffn_dim : default_ffn_dim(config.dim);
  if (width % group->size() != 0)
    throw std::invalid_argument("tensor parallelism: tp " + std::to_string(group->size()) +
                                " does not divide the MLP's width of " + std::to_string(width) + " (--ffn-dim)");
  gate_proj_ = register_module("gate_proj", column(config.dim, width, group));
  up_proj_ = register_module("up_proj", column(config.dim, width, group));
  down_proj_ = register_module("down_proj", row(width, config.dim, group));
}

torch::Tensor TPLlamaMLPImpl::forward(const torch::Tensor& h, bool sequence_parallel) {
  auto y = torch::silu(gate_proj_->forward_gathered(h)) * up_proj_->forward_gathered(h);
  return sequence_parallel ? down_proj_->forward_sequence_parallel(y) : down_proj_->forward(y);
}

TPLlamaBlockImpl::TPLlamaBlockImpl(const LlamaConfig& config, CommPtr group) : config_(config), group_(group) {
  input_layernorm_ = register_module("input_layernorm", deferred(RMSNorm(config.dim, config.rms_norm_eps)));
  self_attn_ = register_module("self_attn", TPLlamaAttention(config, group));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", deferred(RMSNorm(config.dim, config.rms_norm_eps)));
  mlp_ = register_module("mlp", TPLlamaMLP(config, group));
}

torch::Tensor TPLlamaBlockImpl::enter(RMSNorm& norm, const torch::Tensor& x) {
  if (!sequence_parallel_) return tp::copy_to_group(norm->forward(x), group_);
  // On a sequence slice the norm's weight sees only this rank's positions:
  // through copy_to_group its gradient is summed over the group.
  return tp::gather_sequence(rms_norm(x, tp::copy_to_group(norm->weight, group_), norm->eps()), group_);
}

torch::Tensor TPLlamaBlockImpl::forward(torch::Tensor x) {
  const int64_t T = sequence_parallel_ ? x.size(1) * group_->size() : x.size(1);
  const auto [cos, sin] = rotary_tables(models::sequence_positions(T, x.device()), config_.dim / config_.n_head,
                                        config_.rope_theta);  // Note [sequence context]
  x = x + self_attn_->forward(enter(input_layernorm_, x), cos, sin, sequence_parallel_);
  return x + mlp_->forward(enter(post_attention_layernorm_, x), sequence_parallel_);
}

TPLlamaImpl::TPLlamaImpl(const LlamaConfig& config, CommPtr group, bool sequence_parallel, LlamaPart part)
    : config_(config), group_(std::move(group)), sequence_parallel_(sequence_parallel), part_(check_llama(config, part)) {
  check_tensor_parallel(config_, group_->size());
  // Llama's registration order and names (see LlamaImpl's constructor).
  if (part_.is_first() || (part_.is_last() && config_.tie_embeddings)) {
    embed_tokens_ = register_module("embed_tokens",
                                    deferred(tp::VocabParallelEmbedding(config_.vocab_size, config_.dim, group_)));
    // The same vocabulary rows on both ends on one tp rank: the tied copies'
    // gradients are summed slice by slice (pp::sum_tied_gradients).
    if (config_.tie_embeddings && part_.stages > 1) dtrain::detail::declare_unit(embed_tokens_.ptr());
  }
  auto layers = register_module("layers", std::make_shared<torch::nn::Module>());
  for (int64_t i = part_.first_block; i < part_.last_block; ++i) {
    layer_calls_.emplace_back(TPLlamaBlock(config_, group_).ptr());
    layers->register_module(std::to_string(i), layer_calls_.back().ptr());
  }
  if (part_.is_last()) {
    norm_ = register_module("norm", deferred(RMSNorm(config_.dim, config_.rms_norm_eps)));
    if (!config_.tie_embeddings) lm_head_ = register_module("lm_head", column(config_.dim, config_.vocab_size, group_));
  }
  initialize_unless_deferred(*this);
}

void TPLlamaImpl::init_module(const std::string& /*name*/, torch::nn::Module& module, at::Generator& generator) {
  torch::NoGradGuard no_grad;
  // Llama's N(0, 0.02), drawn at full size from the module's generator
  // exactly as init_llama_module draws it, this rank's slice kept.
  const auto full_normal = [&generator](std::vector<int64_t> shape) {
    return torch::empty(shape).normal_(0.0, 0.02, generator);
  };
  if (auto* column_layer = module.as<tp::ColumnParallelLinear>()) {
    column_layer->load_full(full_normal({column_layer->out_features(), column_layer->in_features()}));
  } else if (auto* row_layer = module.as<tp::RowParallelLinear>()) {
    row_layer->load_full(full_normal({row_layer->out_features(), row_layer->in_features()}));
  } else if (auto* embedding = module.as<tp::VocabParallelEmbedding>()) {
    embedding->load_full(full_normal({embedding->vocab_size(), embedding->dim()}));
  } else {
    init_llama_module(module, generator);
  }
}

torch::Tensor TPLlamaImpl::forward(torch::Tensor input) {
  torch::Tensor x = input;
  bool sequence_parallel = false;
  if (part_.is_first()) {
    check_materialized(embed_tokens_->weight, "TPLlama");
    TORCH_CHECK(input.dim() == 2 && input.scalar_type() == torch::kLong,
                "TPLlama: expected int64 tokens of shape [B,T], got ", input.scalar_type(), " ", input.sizes());
    const int64_t T = input.size(1);
    TORCH_CHECK(models::sequence_length(T) <= config_.seq_len, "TPLlama: sequence of ", models::sequence_length(T), " tokens is longer than its context of ",
                config_.seq_len);
    sequence_parallel = sequence_parallel_ && group_->size() > 1 && T % group_->size() == 0;
    const auto embed = [this, sequence_parallel](const torch::Tensor& tokens) {
      // Sequence parallel: the vocabulary rows' partial lookups reduce-scattered.
      return sequence_parallel ? tp::reduce_scatter_sequence(embed_tokens_->partial(tokens), group_)
                               : embed_tokens_->forward(tokens);
    };
    x = dtrain::detail::run_unit(embed_tokens_.get(), embed, input);
  } else {
    // A later stage: its slice of the whole activation (Note [sequence
    // parallel stages], src/tp/tp_gpt_stage.cpp).
    sequence_parallel = sequence_parallel_ && group_->size() > 1 && input.size(1) % group_->size() == 0;
    if (sequence_parallel) x = tp::split_sequence(input, group_);
  }
  // The blocks keep the layout until the next forward: a recomputation in
  // backward (activation checkpointing) must see the same one.
  for (auto& layer : layer_calls_) {
    layer->set_sequence_parallel(sequence_parallel);
    x = layer(x);
  }
  if (part_.is_last()) return head(x, sequence_parallel);
  return sequence_parallel ? tp::gather_sequence_replicated(x, group_) : x;
}

torch::Tensor TPLlamaImpl::head(const torch::Tensor& x, bool sequence_parallel) {
  // Whole sequences into the column-parallel head; gather_sequence's
  // backward sums the ranks' vocabulary slices' contributions, as
  // copy_to_group's does.
  const auto h = sequence_parallel
                     ? tp::gather_sequence(rms_norm(x, tp::copy_to_group(norm_->weight, group_), norm_->eps()), group_)
                     : tp::copy_to_group(norm_->forward(x), group_);
  if (!config_.tie_embeddings) return lm_head_->forward_gathered(h);
  check_materialized(embed_tokens_->weight, "TPLlama");  // the last stage's tied copy
  return dtrain::detail::run_unit(
      embed_tokens_.get(), [this](const torch::Tensor& y) { return y.matmul(embed_tokens_->weight.t()); }, h);
}

torch::Tensor TPLlamaImpl::loss(const torch::Tensor& logits_slice, const torch::Tensor& targets) const {
  return tp::vocab_parallel_cross_entropy(logits_slice.reshape({-1, logits_slice.size(-1)}), targets.reshape({-1}),
                                          group_);
}

}  // namespace dtrain::models
