// The models as lists of units (include/dtrain/plan.h), from their
// configuration alone.
//
// Parameter names and sizes follow src/models/*.cpp exactly (tests/plan
// compares them with the units FSDP builds). Activation sizes count what
// LibTorch 2.15's CPU kernels save for backward in these forwards; they were
// checked against the tracking allocator (include/dtrain/memory.h) on the
// pinned LibTorch, and the backward workspaces are rounded from the same
// measurements. A kernel that changes what it saves changes them.
#include "dtrain/plan.h"
#include "plan/plan_internal.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

namespace dtrain::plan {
namespace {

using detail::kFloatBytes;
using detail::kLongBytes;
constexpr int64_t kImageSide = 28;
constexpr int64_t kPixels = kImageSide * kImageSide;
constexpr int64_t kClasses = 10;

int64_t element_size(torch::ScalarType dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

void check_batch(int64_t batch_per_rank) {
  if (batch_per_rank < 1)
    throw std::invalid_argument("plan: the per-rank batch must be at least 1, got " + std::to_string(batch_per_rank));
}

// through_linear: the model multiplies it through dtrain::linear (--fp8 takes it).
void add_linear(UnitSpec& unit, const std::string& prefix, int64_t in, int64_t out, bool through_linear = false) {
  unit.parameters.push_back({prefix + ".weight", out * in, through_linear ? in : 0, through_linear ? out : 0});
  unit.parameters.push_back({prefix + ".bias", out});
}

void add_layer_norm(UnitSpec& unit, const std::string& prefix, int64_t width) {
  unit.parameters.push_back({prefix + ".weight", width});
  unit.parameters.push_back({prefix + ".bias", width});
}

std::string description_of(const models::GPTConfig& c) {
  return "gpt: " + std::to_string(c.n_layer) + " layers, dim " + std::to_string(c.n_embd) + ", " +
         std::to_string(c.n_head) + " heads, seq_len " + std::to_string(c.seq_len) + ", vocab " +
         std::to_string(c.vocab_size);
}

}  // namespace

int64_t UnitSpec::numel() const {
  int64_t total = 0;
  for (const auto& p : parameters) total += p.numel;
  return total;
}

int64_t ModelSpec::parameter_count() const {
  int64_t total = 0;
  for (const auto& unit : units) total += unit.numel();
  return total;
}

ModelSpec describe_gpt(const models::GPTConfig& config, int64_t batch_per_rank, torch::ScalarType compute_dtype) {
  models::GPTImpl::parameter_count(config);  // validates the configuration (throws std::invalid_argument)
  check_batch(batch_per_rank);
  if (config.dropout > 0)
    throw std::invalid_argument("plan: GPT dropout > 0 is not modelled (its masks are extra activations)");
  const int64_t B = batch_per_rank, T = config.seq_len, C = config.n_embd, V = config.vocab_size,
                H = config.n_head;
  const int64_t e = element_size(compute_dtype);
  const int64_t tokens = B * T;

  ModelSpec model;
  model.description = description_of(config);
  model.batch_per_rank = B;

  // The root: wte, wpe, then (after the blocks in registration order) ln_f.
  UnitSpec root;
  root.parameters.push_back({"wte.weight", V * C});
  root.parameters.push_back({"wpe.weight", T * C});
  add_layer_norm(root, "ln_f", C);
  // Before the blocks: the embeddings' sum x0 (saved by block 0's ln_1) and
  // the int64 positions (saved by wpe's embedding backward).
  root.activation_bytes = tokens * C * e + T * kLongBytes;
  // Its backward, at the end of the step: the embeddings' own gradients
  // (wte's zeroed [V,C] and the accumulation with the head's contribution,
  // wpe's [T,C]) and the positions they index with.
  root.backward_end_workspace_bytes = 2 * V * C * e + T * C * e + T * kLongBytes;
  model.units.push_back(root);

  for (int64_t layer = 0; layer < config.n_layer; ++layer) {
    const std::string prefix = "blocks." + std::to_string(layer);
    UnitSpec block;
    block.name = prefix;
    add_layer_norm(block, prefix + ".ln_1", C);
    add_linear(block, prefix + ".qkv", C, 3 * C, true);
    add_linear(block, prefix + ".attn_proj", C, C, true);
    add_layer_norm(block, prefix + ".ln_2", C);
    add_linear(block, prefix + ".mlp_fc", C, 4 * C, true);
    add_linear(block, prefix + ".mlp_proj", 4 * C, C, true);
    // Per token: ln_1 out (C), qkv out (3C, which attention saves as q, k, v
    // views), attention out (C; the CPU flash kernel lays it out so that
    // the reshape to [B,T,C] is a view), the residual x1 (C), ln_2 out (C),
    // mlp_fc out (4C), gelu out (4C) and the block's output (C) = 16C.
    // Plus per token: two LayerNorms' mean and rstd and attention's
    // log-sum-exp per head, in fp32.
    block.activation_bytes = 16 * tokens * C * e + (4 * tokens + H * tokens) * kFloatBytes;
    // Gradients of its activations while its backward runs (at most about
    // 7C per token over what it saved: gelu's and mlp_fc's output gradients
    // and the residual stream's; measured 6.5-6.8C).
    block.backward_workspace_bytes = 7 * tokens * C * e;
    // Checkpointed: only its output (C per token), which the next block's
    // recompute (or ln_f) keeps as its input.
    block.checkpointed_activation_bytes = tokens * C * e;
    model.units.push_back(block);
  }

  // After the blocks: ln_f's output (saved by the head's matmul) and its
  // statistics.
  model.root_tail_activation_bytes = tokens * C * e + 2 * tokens * kFloatBytes;
  model.root_tail_gradient_bytes = (V * C + 2 * C) * e;
  // Logits, cast to the output dtype (fp32) when computed in another.
  model.output_bytes = tokens * V * kFloatBytes;
  model.loss_bytes = tokens * V * kFloatBytes + kFloatBytes;  // log-softmax output, the loss
  model.input_bytes = 2 * tokens * kLongBytes;                // tokens and targets
  detail::set_transformer_flops(model, tokens, T, C, V * C);
  return model;
}

ModelSpec describe_mlp(const std::vector<int64_t>& hidden_sizes, int64_t batch_per_rank,
                       torch::ScalarType compute_dtype) {
  check_batch(batch_per_rank);
  const int64_t B = batch_per_rank, e = element_size(compute_dtype);
  ModelSpec model;
  model.description = "mlp: hidden";
  model.batch_per_rank = B;
  UnitSpec root;
  // layers: Flatten (index 0), then Linear, ReLU per hidden size, then the
  // output Linear (src/models/mlp.cpp; no Dropout modules at dropout 0).
  int64_t index = 1, width = kPixels, widest = 0, saved = 0;
  for (int64_t hidden : hidden_sizes) {
    if (hidden <= 0) throw std::invalid_argument("plan: MLP hidden sizes must be positive, got " + std::to_string(hidden));
    add_linear(root, "layers." + std::to_string(index), width, hidden);
    index += 2;
    model.description += " " + std::to_string(hidden);
    saved += hidden;  // ReLU's output (saved by ReLU and the next Linear)
    widest = std::max(widest, hidden);
    width = hidden;
  }
  add_linear(root, "layers." + std::to_string(index), width, kClasses);
  root.forward_flops = 2.0 * static_cast<double>(B * root.numel());
  root.activation_bytes = B * saved * e;
  root.backward_workspace_bytes = 2 * B * std::max(widest, kClasses) * e;
  // At its end: the gradient of the first layer's output, while that
  // layer's weight gradient is computed.
  root.backward_end_workspace_bytes = B * (hidden_sizes.empty() ? kClasses : hidden_sizes.front()) * e;
  model.units.push_back(root);
  model.output_bytes = B * kClasses * kFloatBytes;
  model.loss_bytes = B * kClasses * kFloatBytes + kFloatBytes;
  model.input_bytes = B * kPixels * kFloatBytes + B * kLongBytes;
  return model;
}

ModelSpec describe_cnn(int64_t batch_per_rank, torch::ScalarType compute_dtype) {
  check_batch(batch_per_rank);
  const int64_t B = batch_per_rank, e = element_size(compute_dtype);
  ModelSpec model;
  model.description = "cnn: conv 16, conv 32, linear 64, linear 10";
  model.batch_per_rank = B;
  UnitSpec root;
  root.parameters = {{"conv1.weight", 16 * 1 * 3 * 3}, {"conv1.bias", 16},   {"norm1.weight", 16},
                     {"norm1.bias", 16},               {"conv2.weight", 32 * 16 * 3 * 3}, {"conv2.bias", 32},
                     {"norm2.weight", 32},             {"norm2.bias", 32},   {"hidden.weight", 64 * 32 * 7 * 7},
                     {"hidden.bias", 64},              {"output.weight", 10 * 64}, {"output.bias", 10}};
  const int64_t conv1 = 16 * kPixels, pool1 = 16 * 14 * 14, conv2 = 32 * 14 * 14, pool2 = 32 * 7 * 7;
  // Multiply-adds per sample: each convolution's kernel at every output
  // position, then the two linear layers.
  root.forward_flops = 2.0 * static_cast<double>(B * (conv1 * 9 + conv2 * 16 * 9 + 64 * pool2 + 10 * 64));
  // Per sample: conv outputs (saved by BatchNorm), ReLU outputs (saved by
  // ReLU and max-pool), max-pool outputs and their int64 indices, the hidden
  // ReLU's output; per BatchNorm channel: the batch mean and inverse std.
  root.activation_bytes = B * (conv1 * 2 + pool1 + conv2 * 2 + pool2 + 64) * e +
                          B * (pool1 + pool2) * kLongBytes + (16 + 32) * 2 * kFloatBytes;
  // Measured: 7776 elements per sample at the peak of backward (in the
  // convolutions' backward, about 0.62 conv1 outputs), after the linear
  // layers' gradients.
  root.backward_workspace_bytes = B * 7776 * e;
  root.gradients_at_workspace_peak = 64 * 32 * 7 * 7 + 64 + 10 * 64 + 10;
  model.units.push_back(root);
  // running_mean and running_var (fp32) and num_batches_tracked (int64) per BatchNorm.
  model.buffer_bytes = (16 + 32) * 2 * kFloatBytes + 2 * kLongBytes;
  model.output_bytes = B * kClasses * kFloatBytes;
  model.loss_bytes = B * kClasses * kFloatBytes + kFloatBytes;
  model.input_bytes = B * kPixels * kFloatBytes + B * kLongBytes;
  return model;
}

namespace detail {

void set_transformer_flops(ModelSpec& model, int64_t tokens, int64_t seq_len, int64_t attention_width,
                           int64_t head_numel) {
  const double n = static_cast<double>(tokens);
  for (size_t u = 1; u < model.units.size(); ++u)
    model.units[u].forward_flops = 2.0 * n * static_cast<double>(model.units[u].numel()) +
                                   2.0 * n * static_cast<double>(seq_len * attention_width);
  model.head_forward_flops = 2.0 * n * static_cast<double>(head_numel);
}

}  // namespace detail

Optimizer optimizer_from(const std::string& name, double momentum) {
  if (name == "adamw") return Optimizer::AdamW;
  return momentum > 0 ? Optimizer::SGDMomentum : Optimizer::SGD;
}

}  // namespace dtrain::plan
