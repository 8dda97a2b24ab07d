// One pipeline stage of the GPT as a list of units (include/dtrain/plan.h,
// describe_gpt_stage), cut from the whole model's description at one
// microbatch's size: the stage's blocks as describe_gpt (or describe_tp_gpt)
// describes them, the embeddings' part of the root on the first stage, ln_f,
// the head and the loss on the last (src/models/gpt_stage.cpp,
// src/tp/tp_gpt_stage.cpp). tests/plan checks the replay of a pipeline step
// against the tracking allocator.
#include "dtrain/plan.h"
#include "plan/plan_internal.h"

#include <c10/core/ScalarType.h>

#include <stdexcept>
#include <string>

namespace dtrain::plan {

ModelSpec describe_gpt_stage(const models::GPTConfig& config, int64_t batch_per_rank, int microbatches,
                             torch::ScalarType compute_dtype, int stage, int stages, int tp, bool sequence_parallel,
                             int cp) {
  detail::check_stage(batch_per_rank, microbatches, stage, stages);
  const auto blocks = pp::divide_blocks(config.n_layer, stages)[static_cast<size_t>(stage)];
  const int64_t micro = batch_per_rank / microbatches;
  sequence_parallel = sequence_parallel && tp > 1;
  // The whole model at one microbatch (and this rank's T / cp tokens): its
  // blocks are the stage's, and its root's parts go to the end stages.
  const ModelSpec whole = describe_tp_gpt(config, micro, compute_dtype, tp, sequence_parallel, cp);
  const int64_t T = cp > 1 ? detail::context_parallel_tokens(config.seq_len, cp) : config.seq_len;
  const UnitSpec& whole_root = whole.units[0];
  const int64_t e = static_cast<int64_t>(c10::elementSize(compute_dtype));
  const int64_t wte_numel = config.vocab_size / tp * config.n_embd;
  const bool first = stage == 0, last = stage == stages - 1;

  ModelSpec model;
  model.description = whole.description + ", pipeline stage " + std::to_string(stage) + " of " +
                      std::to_string(stages) + " (blocks " + std::to_string(blocks.first) + "-" +
                      std::to_string(blocks.last - 1) + "), " + std::to_string(microbatches) + " microbatches of " +
                      std::to_string(micro);
  model.batch_per_rank = batch_per_rank;
  model.tensor_parallel = tp;
  model.input_bytes = whole.input_bytes * microbatches;  // every stage loads the part's tokens and targets
  // Sent in the compute dtype (Note [stage dtype] in dtrain/pipeline.h).
  model.pipeline = {stage, stages, microbatches, micro * T * config.n_embd * e, first || last};
  // Under sequence parallelism the last block's output is a slice, which
  // the gathered whole replaces (Note [sequence parallel stages]).
  if (sequence_parallel && !last) model.pipeline.output_bytes = model.pipeline.message_bytes * (tp - 1) / tp;

  UnitSpec root;  // the stage module: wpe on the first stage, ln_f on the last
  for (const auto& p : whole_root.parameters) {
    const bool embedding = p.name == "wpe.weight";
    const bool final_norm = p.name.rfind("ln_f.", 0) == 0;
    if ((first && embedding) || (last && final_norm)) root.parameters.push_back(p);
  }
  if (first) {
    // The embeddings' sum (and the positions, and tp's local indices), and
    // at the end of its backward the embeddings' gradients without the
    // head's contribution (which is the last stage's).
    root.activation_bytes = whole_root.activation_bytes;
    root.backward_end_workspace_bytes = whole_root.backward_end_workspace_bytes - wte_numel * e;
  }
  model.units.push_back(root);
  if (first || last) {
    UnitSpec wte;
    wte.name = "wte";
    wte.parameters.push_back({"wte.weight", wte_numel});
    model.units.push_back(wte);
  }
  for (int64_t b = blocks.first; b < blocks.last; ++b) model.units.push_back(whole.units[static_cast<size_t>(1 + b)]);
  if (last) {
    model.root_tail_activation_bytes = whole.root_tail_activation_bytes;
    model.root_tail_gradient_bytes = whole.root_tail_gradient_bytes;
    model.output_bytes = whole.output_bytes;
    model.loss_bytes = whole.loss_bytes;
    model.head_forward_flops = whole.head_forward_flops;
  }

  const int64_t stage_blocks = blocks.last - blocks.first, C = config.n_embd;
  detail::add_stage_tp_collectives(model, tp, stage_blocks, micro * T, C * e, sequence_parallel);
  if (sequence_parallel) {
    // The replicated parameters used on sequence slices sum their gradients
    // in each microbatch's backward (describe_tp_gpt's, per stage): per block
    // the LayerNorms' and the row layers' biases, wpe on the first stage and
    // ln_f on the last.
    const int64_t calls = 6 * stage_blocks + (first ? 1 : 0) + (last ? 2 : 0);
    const int64_t bytes = 6 * C * stage_blocks + (first ? config.seq_len * C : 0) + (last ? 2 * C : 0);
    model.collectives.push_back({"all_reduce", "replicated grads, tensor parallel", tp, calls * microbatches,
                                 bytes * microbatches * detail::kFloatBytes, 0});
  }
  detail::add_ring_sends(model, cp, stage_blocks * microbatches, micro * T, C / tp, e);
  return model;
}

}  // namespace dtrain::plan

namespace dtrain::plan::detail {

void check_stage(int64_t batch_per_rank, int microbatches, int stage, int stages) {
  if (stages < 2 || stage < 0 || stage >= stages)
    throw std::invalid_argument("plan: stage " + std::to_string(stage) + " of " + std::to_string(stages) +
                                " (a pipeline has at least 2 stages)");
  if (microbatches < 1 || batch_per_rank % microbatches != 0)
    throw std::invalid_argument("plan: a batch part of " + std::to_string(batch_per_rank) +
                                " windows does not split into " + std::to_string(microbatches) + " microbatches");
}

void add_stage_tp_collectives(ModelSpec& model, int tp, int64_t blocks, int64_t tokens, int64_t token_bytes,
                              bool sequence_parallel) {
  if (tp <= 1) return;
  const auto& stage = model.pipeline;
  const int64_t ends = (stage.first() ? 1 : 0) + (stage.last() ? 1 : 0);
  const int64_t calls = stage.microbatches * (4 * blocks + ends);
  const std::string group = "activations, tensor parallel";
  if (!sequence_parallel) {
    model.collectives.push_back({"all_reduce", group, tp, calls, calls * tokens * token_bytes, 0});
  } else {
    const int64_t boundaries = stage.microbatches * (2 - ends);  // the stage's input and output kept whole
    model.collectives.push_back(
        {"all_gather", group, tp, calls + boundaries, (calls + boundaries) * tokens * token_bytes, 0});
    model.collectives.push_back({"reduce_scatter", group, tp, calls, calls * tokens * token_bytes, 0});
  }
  if (stage.last())
    model.collectives.push_back({"all_reduce", "loss, tensor parallel", tp, 3 * stage.microbatches,
                                 3 * stage.microbatches * tokens * kFloatBytes, 0});
}

}  // namespace dtrain::plan::detail
