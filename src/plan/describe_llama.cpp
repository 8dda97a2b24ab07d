// Llama as a list of units (include/dtrain/plan.h, describe_llama and
// describe_llama_stage), from its configuration alone, following
// src/models/llama_block.cpp, src/models/llama.cpp and src/tp/tp_llama.cpp.
//
// Note [llama activations]
// What autograd keeps from a Llama block's forward, per token, on LibTorch
// 2.15's CPU kernels (checked against the tracking allocator by tests/plan
// at fp32 and bf16, whole and tensor-parallel, with and without
// grouped-query attention):
// - RMSNorm: its statistic rsqrt(mean(x^2)) in fp32, the normalised
//   activation and its output (the next matrix products' input). In fp32
//   it also keeps its input x, the residual stream's tensor itself; in
//   another compute dtype it keeps the fp32 copy of x instead, and the
//   residual stream's tensors are then kept by nobody.
// - Rotary embeddings keep only their cos/sin tables (x * cos needs cos, not
//   x): two [T, head_dim] fp32 tables, or in another dtype four copies cast
//   to it (one pair for q, one for k).
// - Attention keeps q, k and v as it receives them, its output and one fp32
//   log-sum-exp per head. Under grouped-query attention k and v arrive
//   repeated to every query head. A tensor-parallel rank whose group
//   exceeds the kv heads (Note [replicated key/value heads]) takes its heads
//   of the repeated v as a view, which keeps all of it alive.
// - SwiGLU keeps gate_proj's output, silu's, up_proj's and their product.
#include "dtrain/llama.h"
#include "dtrain/plan.h"
#include "dtrain/tp_llama.h"
#include "plan/plan_internal.h"

#include <c10/core/ScalarType.h>

#include <stdexcept>
#include <string>

namespace dtrain::plan {
namespace {

using detail::kFloatBytes;
using detail::kLongBytes;

std::string description_of(const models::LlamaConfig& c, int64_t width) {
  return "llama: " + std::to_string(c.n_layer) + " layers, dim " + std::to_string(c.dim) + ", " +
         std::to_string(c.n_head) + " heads (" + std::to_string(c.n_kv_head) + " key/value), MLP " +
         std::to_string(width) + ", seq_len " + std::to_string(c.seq_len) + ", vocab " + std::to_string(c.vocab_size) +
         (c.tie_embeddings ? ", tied head" : "");
}

}  // namespace

ModelSpec describe_llama(const models::LlamaConfig& config, int64_t batch_per_rank, torch::ScalarType compute_dtype,
                         int tp, bool sequence_parallel, int cp) {
  models::LlamaImpl::parameter_count(config);  // validates the configuration
  if (cp < 1) throw std::invalid_argument("plan: cp must be at least 1, got " + std::to_string(cp));
  if (cp > 1) {
    // The model at this rank's T / cp tokens (no parameter depends on T);
    // k and v reach the ring repeated to every query head.
    models::LlamaConfig local = config;
    local.seq_len = detail::context_parallel_tokens(config.seq_len, cp);
    ModelSpec model = describe_llama(local, batch_per_rank, compute_dtype, tp, sequence_parallel);
    model.description = describe_llama(config, 1, compute_dtype, tp, sequence_parallel).description +
                        ", context-parallel over " + std::to_string(cp) + " ranks (" + std::to_string(local.seq_len) +
                        " tokens of each sequence per rank)";
    const int64_t e = static_cast<int64_t>(c10::elementSize(compute_dtype));
    const int64_t F = config.ffn_dim > 0 ? config.ffn_dim : models::default_ffn_dim(config.dim);
    detail::add_ring_attention(model, cp, batch_per_rank * local.seq_len, config.dim / tp, e, 4 * F / tp * e);
    detail::set_transformer_flops(model, batch_per_rank * local.seq_len, config.seq_len, config.dim / tp,
                                  config.vocab_size / tp * config.dim);
    return model;
  }
  if (batch_per_rank < 1)
    throw std::invalid_argument("plan: the per-rank batch must be at least 1, got " + std::to_string(batch_per_rank));
  if (config.dropout > 0)
    throw std::invalid_argument("plan: Llama's attention dropout > 0 is not modelled (its masks are extra activations)");
  if (tp < 1) throw std::invalid_argument("plan: tp must be at least 1, got " + std::to_string(tp));
  if (tp > 1) models::check_tensor_parallel(config, tp);
  sequence_parallel = sequence_parallel && tp > 1;
  const int64_t F = config.ffn_dim > 0 ? config.ffn_dim : models::default_ffn_dim(config.dim);
  if (F % tp != 0)
    throw std::invalid_argument("plan: tp " + std::to_string(tp) + " does not divide the MLP's width of " +
                                std::to_string(F));
  if (sequence_parallel && config.seq_len % tp != 0)
    throw std::invalid_argument("plan: sequence parallelism needs seq_len " + std::to_string(config.seq_len) +
                                " divisible by tp " + std::to_string(tp));
  const int64_t n = tp, B = batch_per_rank, T = config.seq_len, C = config.dim, V = config.vocab_size,
                H = config.n_head, KV = config.n_kv_head, hd = C / H;
  const int64_t e = static_cast<int64_t>(c10::elementSize(compute_dtype));
  const bool fp32 = e == kFloatBytes;
  const int64_t tokens = B * T;
  // The residual stream's tokens on this rank: all, or its sequence slice.
  const int64_t outside = sequence_parallel ? tokens / n : tokens;
  const bool whole_kv = n > 1 && !models::splits_kv_heads(config, tp);  // Note [replicated key/value heads]
  const int64_t kv_weight = whole_kv ? KV * hd * C : KV * hd / n * C;

  ModelSpec model;
  model.description = description_of(config, F);
  if (n > 1)
    model.description += ", tensor-parallel over " + std::to_string(tp) + " ranks" +
                         (sequence_parallel ? " (sequence parallel)" : "");
  model.batch_per_rank = B;
  model.tensor_parallel = tp;

  // The root: embed_tokens, then (after the layers) norm and the untied head.
  UnitSpec root;
  root.parameters.push_back({"embed_tokens.weight", V / n * C});
  root.parameters.push_back({"norm.weight", C});
  if (!config.tie_embeddings) root.parameters.push_back({"lm_head.weight", V / n * C});
  // The embedding's output, which block 0's RMSNorm keeps in fp32 (Note
  // [llama activations]); under tp the vocabulary-parallel lookup's local
  // indices (int64) and mask (compute dtype) over every token.
  root.activation_bytes = (fp32 ? outside * C * e : 0) + (n > 1 ? tokens * (kLongBytes + e) : 0);
  // Its backward, at the end of the step: embed_tokens' gradient, and with
  // a tied head its accumulation with the head's contribution.
  root.backward_end_workspace_bytes = (config.tie_embeddings ? 2 : 1) * V / n * C * e;
  model.units.push_back(root);

  // One RMSNorm's activations per token of the residual stream (its
  // output's are counted where it is whole under sequence parallelism).
  const int64_t norm_bytes_outside = (fp32 ? C * e : C * kFloatBytes + C * e) + kFloatBytes;
  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    const std::string prefix = "layers." + std::to_string(layer);
    UnitSpec block;
    block.name = prefix;
    block.parameters.push_back({prefix + ".input_layernorm.weight", C});
    // The projections go through dtrain::linear (--fp8, which refuses --tp:
    // marked where they are whole). ParameterSpec{name, numel, in, out}.
    const int64_t whole = n == 1 ? 1 : 0, kv_out = kv_weight / C;
    block.parameters.push_back({prefix + ".self_attn.q_proj.weight", C / n * C, whole * C, whole * C});
    block.parameters.push_back({prefix + ".self_attn.k_proj.weight", kv_weight, whole * C, whole * kv_out});
    block.parameters.push_back({prefix + ".self_attn.v_proj.weight", kv_weight, whole * C, whole * kv_out});
    block.parameters.push_back({prefix + ".self_attn.o_proj.weight", C * (C / n), whole * C, whole * C});
    block.parameters.push_back({prefix + ".post_attention_layernorm.weight", C});
    block.parameters.push_back({prefix + ".mlp.gate_proj.weight", F / n * C, whole * C, whole * F});
    block.parameters.push_back({prefix + ".mlp.up_proj.weight", F / n * C, whole * C, whole * F});
    block.parameters.push_back({prefix + ".mlp.down_proj.weight", C * (F / n), whole * F, whole * C});
    // Two RMSNorms, each output whole per token (gathered under sequence
    // parallelism); in fp32 the residual stream's x1 and the block's output,
    // which the next RMSNorms keep as their inputs.
    const int64_t norms = 2 * (outside * norm_bytes_outside + tokens * C * e);
    const int64_t residual = fp32 ? 2 * outside * C * e : 0;
    // q, k, out on this rank's heads; v too, unless it is this rank's view
    // of every head's.
    const int64_t attention = (3 * C / n + (whole_kv ? C : C / n)) * tokens * e + H / n * tokens * kFloatBytes;
    const int64_t mlp = 4 * F / n * tokens * e;
    const int64_t rotary = (fp32 ? 2 : 4) * T * hd * e;
    block.activation_bytes = norms + residual + attention + mlp + rotary;
    // Gradients of its activations while its backward runs: the SwiGLU's
    // (split) and the residual stream's. The SwiGLU's backward holds up to
    // two F-wide gradients while it frees what it kept; 1.5 F per token
    // keeps every run of tests/plan/test_plan_llama.cpp within 3% (F: 2.3%
    // under with activation checkpointing, 2 F: 4% over on 4 stages).
    block.backward_workspace_bytes = (3 * F / (2 * n) * tokens + 2 * C * outside) * e;
    // Checkpointed: only its output, which the next block's recompute (or
    // the final RMSNorm) keeps as its input.
    block.checkpointed_activation_bytes = outside * C * e;
    model.units.push_back(block);
  }

  // The final RMSNorm (its output whole: the head's input), this rank's
  // slice of the logits, and the head's gradients (the tied head's
  // contribution to embed_tokens', or lm_head's) with norm's.
  model.root_tail_activation_bytes = outside * norm_bytes_outside + tokens * C * e;
  model.root_tail_gradient_bytes = (V / n * C + C) * e;
  model.output_bytes = tokens * (V / n) * kFloatBytes;  // cast to the output dtype (fp32)
  if (n == 1) {
    model.loss_bytes = tokens * V * kFloatBytes + kFloatBytes;  // log-softmax output, the loss
  } else {
    // The vocabulary-parallel cross-entropy (src/tp/vocab_parallel.cpp):
    // the shifted slice (gather keeps its input) and its exp, and per token
    // the local target index, its mask and the sum of exponentials.
    model.loss_bytes = 2 * tokens * (V / n) * kFloatBytes + tokens * (kLongBytes + 2 * kFloatBytes) + kFloatBytes;
  }
  model.input_bytes = 2 * tokens * kLongBytes;  // tokens and targets

  if (n > 1) {
    // The tp group's collectives per step, [B, T, C] each (as TPGPT's):
    // per block an all-reduce after each row-parallel layer (forward) and
    // before each column-parallel one (backward), the embedding's and the
    // head input's; under sequence parallelism an all-gather and a
    // reduce-scatter each.
    const int64_t activation = tokens * C * e;
    const int64_t per_step = 4 * config.n_layer + 2;
    const std::string group = "activations, tensor parallel";
    if (!sequence_parallel) {
      model.collectives.push_back({"all_reduce", group, tp, per_step, per_step * activation, 0});
    } else {
      model.collectives.push_back({"all_gather", group, tp, per_step, per_step * activation, 0});
      model.collectives.push_back({"reduce_scatter", group, tp, per_step, per_step * activation, 0});
      // The RMSNorm weights used on sequence slices sum their gradients.
      model.collectives.push_back({"all_reduce", "replicated grads, tensor parallel", tp, 2 * config.n_layer + 1,
                                   (2 * config.n_layer + 1) * C * e, 0});
    }
    if (whole_kv)  // each block's whole k_proj and v_proj sum their gradients
      model.collectives.push_back({"all_reduce", "replicated grads, tensor parallel", tp, 2 * config.n_layer,
                                   2 * config.n_layer * kv_weight * e, 0});
    model.collectives.push_back({"all_reduce", "loss, tensor parallel", tp, 3, 3 * tokens * kFloatBytes, 0});
  }
  detail::set_transformer_flops(model, tokens, T, C / n, V / n * C);
  return model;
}

ModelSpec describe_llama_stage(const models::LlamaConfig& config, int64_t batch_per_rank, int microbatches,
                               torch::ScalarType compute_dtype, int stage, int stages, int tp,
                               bool sequence_parallel, int cp) {
  detail::check_stage(batch_per_rank, microbatches, stage, stages);
  const auto blocks = pp::divide_blocks(config.n_layer, stages)[static_cast<size_t>(stage)];
  const int64_t micro = batch_per_rank / microbatches;
  sequence_parallel = sequence_parallel && tp > 1;
  // The whole model at one microbatch and this rank's T / cp tokens.
  const ModelSpec whole = describe_llama(config, micro, compute_dtype, tp, sequence_parallel, cp);
  const int64_t T = cp > 1 ? detail::context_parallel_tokens(config.seq_len, cp) : config.seq_len;
  const UnitSpec& whole_root = whole.units[0];
  const int64_t e = static_cast<int64_t>(c10::elementSize(compute_dtype));
  const int64_t embedding_numel = config.vocab_size / tp * config.dim;
  const bool first = stage == 0, last = stage == stages - 1;
  const bool tied = config.tie_embeddings;

  ModelSpec model;
  model.description = whole.description + ", pipeline stage " + std::to_string(stage) + " of " +
                      std::to_string(stages) + " (blocks " + std::to_string(blocks.first) + "-" +
                      std::to_string(blocks.last - 1) + "), " + std::to_string(microbatches) + " microbatches of " +
                      std::to_string(micro);
  model.batch_per_rank = batch_per_rank;
  model.tensor_parallel = tp;
  model.input_bytes = whole.input_bytes * microbatches;  // every stage loads the part's tokens and targets
  // Sent in the compute dtype (Note [stage dtype] in dtrain/pipeline.h).
  model.pipeline = {stage, stages, microbatches, micro * T * config.dim * e, tied && (first || last)};
  // Under sequence parallelism the gathered whole output replaces the last
  // block's slice (which fp32 counts as the residual stream's; Note
  // [sequence parallel stages] in src/tp/tp_gpt_stage.cpp).
  if (sequence_parallel && !last)
    model.pipeline.output_bytes =
        model.pipeline.message_bytes - (e == detail::kFloatBytes ? model.pipeline.message_bytes / tp : 0);

  // The stage module (src/models/llama.cpp): untied, embed_tokens on the
  // first stage and norm and lm_head on the last belong to the root; tied,
  // embed_tokens is a unit of its own on both ends (the head's copy).
  UnitSpec root;
  for (const auto& p : whole_root.parameters) {
    const bool embedding = p.name == "embed_tokens.weight", head = p.name == "lm_head.weight";
    if ((first && embedding && !tied) || (last && (p.name == "norm.weight" || head))) root.parameters.push_back(p);
  }
  if (first) {
    root.activation_bytes = whole_root.activation_bytes;
    // embed_tokens' gradient alone: the head's contribution is the last stage's.
    root.backward_end_workspace_bytes = embedding_numel * e;
  }
  model.units.push_back(root);
  if (tied && (first || last)) {
    UnitSpec embed;
    embed.name = "embed_tokens";
    embed.parameters.push_back({"embed_tokens.weight", embedding_numel});
    model.units.push_back(embed);
  }
  for (int64_t b = blocks.first; b < blocks.last; ++b) model.units.push_back(whole.units[static_cast<size_t>(1 + b)]);
  if (last) {
    model.root_tail_activation_bytes = whole.root_tail_activation_bytes;
    model.root_tail_gradient_bytes = whole.root_tail_gradient_bytes;
    model.output_bytes = whole.output_bytes;
    model.loss_bytes = whole.loss_bytes;
    model.head_forward_flops = whole.head_forward_flops;
  }

  const int64_t stage_blocks = blocks.last - blocks.first;
  detail::add_stage_tp_collectives(model, tp, stage_blocks, micro * T, config.dim * e, sequence_parallel);
  if (sequence_parallel) {  // the RMSNorm weights used on sequence slices sum their gradients
    const int64_t calls = (2 * stage_blocks + (last ? 1 : 0)) * microbatches;
    model.collectives.push_back(
        {"all_reduce", "replicated grads, tensor parallel", tp, calls, calls * config.dim * e, 0});
  }
  detail::add_ring_sends(model, cp, stage_blocks * microbatches, micro * T, config.dim / tp, e);
  if (tp > 1) {
    if (!models::splits_kv_heads(config, tp)) {
      const int64_t kv_weight = config.n_kv_head * (config.dim / config.n_head) * config.dim;
      model.collectives.push_back({"all_reduce", "replicated grads, tensor parallel", tp,
                                   2 * stage_blocks * microbatches, 2 * stage_blocks * microbatches * kv_weight * e, 0});
    }
  }
  return model;
}

}  // namespace dtrain::plan
