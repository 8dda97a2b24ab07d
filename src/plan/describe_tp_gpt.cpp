// One rank's slice of the tensor-parallel GPT as a list of units
// (include/dtrain/plan.h, describe_tp_gpt), from the configuration alone,
// following src/tp/tp_gpt.cpp: which activations each rank saves whole
// (the replicated ones, or with sequence parallelism the gathered inputs of
// the column-parallel layers), which split by tp, and the group's
// collectives. The workspaces are describe_gpt's, scaled the same way;
// tests/plan checks the whole against the tracking allocator on every mesh.
#include "dtrain/plan.h"
#include "dtrain/tp_gpt.h"
#include "plan/plan_internal.h"

#include <c10/core/ScalarType.h>

#include <stdexcept>
#include <string>

namespace dtrain::plan {
namespace {

using detail::kFloatBytes;
using detail::kLongBytes;

void add_split_linear(UnitSpec& unit, const std::string& prefix, int64_t weight, int64_t bias) {
  unit.parameters.push_back({prefix + ".weight", weight});
  unit.parameters.push_back({prefix + ".bias", bias});
}

}  // namespace

ModelSpec describe_tp_gpt(const models::GPTConfig& config, int64_t batch_per_rank, torch::ScalarType compute_dtype,
                          int tp, bool sequence_parallel, int cp) {
  if (tp < 1) throw std::invalid_argument("plan: tp must be at least 1, got " + std::to_string(tp));
  if (cp < 1) throw std::invalid_argument("plan: cp must be at least 1, got " + std::to_string(cp));
  if (cp > 1) {
    // The model at this rank's T / cp tokens; wpe and its gradient stay [T, C].
    models::GPTConfig local = config;
    local.seq_len = detail::context_parallel_tokens(config.seq_len, cp);
    ModelSpec model = describe_tp_gpt(local, batch_per_rank, compute_dtype, tp, sequence_parallel);
    const int64_t e = static_cast<int64_t>(c10::elementSize(compute_dtype));
    for (auto& p : model.units[0].parameters)
      if (p.name == "wpe.weight") p.numel = config.seq_len * config.n_embd;
    model.units[0].backward_end_workspace_bytes += (config.seq_len - local.seq_len) * config.n_embd * e;
    model.description = describe_tp_gpt(config, 1, compute_dtype, tp, sequence_parallel).description +
                        ", context-parallel over " + std::to_string(cp) + " ranks (" + std::to_string(local.seq_len) +
                        " tokens of each sequence per rank)";
    // The MLP keeps mlp_fc's and gelu's outputs, 4C / tp wide each.
    detail::add_ring_attention(model, cp, batch_per_rank * local.seq_len, config.n_embd / tp, e,
                               8 * config.n_embd / tp * e);
    detail::set_transformer_flops(model, batch_per_rank * local.seq_len, config.seq_len, config.n_embd / tp,
                                  config.vocab_size / tp * config.n_embd);
    return model;
  }
  if (tp == 1) return describe_gpt(config, batch_per_rank, compute_dtype);
  ModelSpec whole = describe_gpt(config, batch_per_rank, compute_dtype);  // validates config and batch
  models::check_tensor_parallel(config, tp);
  if (sequence_parallel && config.seq_len % tp != 0)
    throw std::invalid_argument("plan: sequence parallelism needs seq_len " + std::to_string(config.seq_len) +
                                " divisible by tp " + std::to_string(tp));
  const int64_t n = tp, B = batch_per_rank, T = config.seq_len, C = config.n_embd, V = config.vocab_size,
                H = config.n_head;
  const int64_t e = static_cast<int64_t>(c10::elementSize(compute_dtype));
  const int64_t tokens = B * T;
  // Activations outside attention and the MLP: whole on every rank, or this
  // rank's sequence slice.
  const int64_t outside = sequence_parallel ? tokens / n : tokens;

  ModelSpec model;
  model.description = whole.description + ", tensor-parallel over " + std::to_string(tp) + " ranks" +
                      (sequence_parallel ? " (sequence parallel)" : "");
  model.batch_per_rank = B;
  model.tensor_parallel = tp;

  UnitSpec root;
  root.parameters.push_back({"wte.weight", V / n * C});  // this rank's vocabulary rows
  root.parameters.push_back({"wpe.weight", T * C});
  root.parameters.push_back({"ln_f.weight", C});
  root.parameters.push_back({"ln_f.bias", C});
  // The embeddings' sum x0 (saved by block 0's ln_1), the positions (wpe's
  // backward), and the vocabulary-parallel lookup's local indices (int64)
  // and mask (compute dtype) over every token.
  root.activation_bytes = outside * C * e + (sequence_parallel ? T / n : T) * kLongBytes + tokens * (kLongBytes + e);
  root.backward_end_workspace_bytes = 2 * V / n * C * e + T * C * e + T * kLongBytes;
  model.units.push_back(root);

  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    const std::string prefix = "blocks." + std::to_string(layer);
    UnitSpec block;
    block.name = prefix;
    block.parameters.push_back({prefix + ".ln_1.weight", C});
    block.parameters.push_back({prefix + ".ln_1.bias", C});
    add_split_linear(block, prefix + ".qkv", 3 * C / n * C, 3 * C / n);
    add_split_linear(block, prefix + ".attn_proj", C * (C / n), C);
    block.parameters.push_back({prefix + ".ln_2.weight", C});
    block.parameters.push_back({prefix + ".ln_2.bias", C});
    add_split_linear(block, prefix + ".mlp_fc", 4 * C / n * C, 4 * C / n);
    add_split_linear(block, prefix + ".mlp_proj", C * (4 * C / n), C);
    // Split by tp: q, k, v (3C), attention's output (C), mlp_fc's and
    // gelu's outputs (4C each). Whole per token: the two column-parallel
    // layers' inputs (ln_1's and ln_2's outputs, gathered under sequence
    // parallelism). On the residual stream (sliced under sequence
    // parallelism): x1 and the block's output. Statistics in fp32: the two
    // LayerNorms' (on the residual stream's tokens) and attention's
    // log-sum-exp for this rank's heads.
    block.activation_bytes = (12 * C / n * tokens + 2 * C * tokens + 2 * C * outside) * e +
                             (4 * outside + H / n * tokens) * kFloatBytes;
    // describe_gpt's 7C per token of activation gradients: the MLP's (split)
    // and the residual stream's (whole, or on the slice), plus an
    // all-reduce's copy of the residual gradient.
    block.backward_workspace_bytes = (4 * C / n * tokens + 3 * C * outside) * e;
    model.units.push_back(block);
  }

  // ln_f's output (the head's input: gathered under sequence parallelism)
  // and its statistics; the head's slice of wte's gradient.
  model.root_tail_activation_bytes = tokens * C * e + 2 * outside * kFloatBytes;
  model.root_tail_gradient_bytes = (V / n * C + 2 * C) * e;
  // This rank's vocabulary slice of the logits, and what the parallel
  // cross-entropy saves: exp of the shifted slice, and per token the local
  // target index, its mask and the sum of exponentials.
  model.output_bytes = tokens * (V / n) * kFloatBytes;
  model.loss_bytes = tokens * (V / n) * kFloatBytes + tokens * (kLongBytes + 2 * kFloatBytes) + kFloatBytes;
  model.input_bytes = whole.input_bytes;

  // The tp group's collectives per step, [B, T, C] each: without sequence
  // parallelism an all-reduce after each row-parallel layer (forward) and
  // before each column-parallel one (backward), the embedding's (forward)
  // and the head's input (backward); with it, each all-reduce becomes an
  // all-gather and a reduce-scatter. The loss all-reduces three floats per
  // token.
  const int64_t activation = tokens * C * e;
  const int64_t per_step = 4 * config.n_layer + 2;  // all-reduces of [B, T, C]
  const std::string group = "activations, tensor parallel";
  if (!sequence_parallel) {
    model.collectives.push_back({"all_reduce", group, tp, per_step, per_step * activation, 0});
  } else {
    model.collectives.push_back({"all_gather", group, tp, per_step, per_step * activation, 0});
    model.collectives.push_back({"reduce_scatter", group, tp, per_step, per_step * activation, 0});
    // The replicated parameters used on sequence slices sum their gradients
    // over the group (copy_to_group): per block the LayerNorms' and the row
    // layers' biases, and wpe and ln_f.
    model.collectives.push_back({"all_reduce", "replicated grads, tensor parallel", tp,
                                 6 * config.n_layer + 3, (6 * C * config.n_layer + T * C + 2 * C) * kFloatBytes, 0});
  }
  model.collectives.push_back({"all_reduce", "loss, tensor parallel", tp, 3,
                               3 * tokens * kFloatBytes, 0});
  detail::set_transformer_flops(model, tokens, T, C / n, V / n * C);
  return model;
}

}  // namespace dtrain::plan
