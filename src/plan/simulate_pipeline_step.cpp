// One training step of a pipeline stage replayed as dtrain train --pp runs
// it, counting bytes.
//
// Note [pipeline memory plan]
// The stage's microbatches run in the schedule's order (pp::schedule_actions,
// src/pp/schedule_actions.cpp, which Pipeline::step runs), between the data-parallel engine's step-wide calls
// (src/train/trainer.cpp, pipeline_forward_and_backward):
// - FSDP (Note [pipeline steps] in src/fsdp/fsdp_state.cpp): every unit is
//   gathered before the first microbatch and stays gathered (per microbatch:
//   the root so; every other unit gathered when a microbatch's forward or
//   backward enters it, freed after its forward as reshard_after_forward
//   says and after its backward as free_after_backward says); gradients
//   accumulate at full size; after the last microbatch each unit in order
//   copies its gradients into a zeroed full-size buffer in the reduce dtype
//   and reduce-scatters it (the bound on outstanding reductions as in one
//   backward), then every unit frees its full parameters and takes its shard
//   gradient.
// - DDP: the microbatches before the last run under no_sync, so their
//   gradients accumulate as separate full-size tensors; in the last one each
//   gradient is copied into its bucket when its bucket completes and the
//   separate tensor is freed (src/ddp/reducer.cpp, mark_ready). Interleaved,
//   the step's last backward runs through chunk 0 only: the other chunks'
//   gradients join their buckets after it, as unused parameters do.
// - Interleaved (ModelSpec::chunks): each action runs through its chunk's
//   description, its units at their places among the rank's.
// - A microbatch's forward: a stage after the first allocates the activation
//   it receives; the blocks save theirs (describe_gpt's, at the
//   microbatch's size); the last stage computes the logits, keeps the
//   log-probabilities for the loss's backward and drops the logits.
// - Its backward: a stage before the last allocates the gradient it
//   receives; the last stage's loss gradients live together for a moment;
//   each unit's workspace, then its activations go; the first backward of
//   the step creates the stage's gradients at full size (after zero_grad's
//   set_to_none), the later ones add into them (each new weight gradient
//   exists for a moment first: planned at the block's workspace peak, as
//   its largest parameter's). A stage after the first
//   sends its input's gradient back and holds it until the send completes:
//   planned as until the end of its next backward, when the pipeline drops
//   completed sends (the stage before receives it in its own backward of
//   the same microbatch).
// - A stage's forward output is what it sends on, so it costs nothing
//   beyond the block's saved output; under sequence parallelism the whole
//   output gathered from the slices costs what PipelineStage::output_bytes
//   says, until the microbatch's backward has run.
#include "plan/plan_internal.h"
#include "plan/replay.h"
#include "fsdp/schedule_rules.h"

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::plan::detail {
namespace {

constexpr Field kActivations = &MemoryBreakdown::activations;
constexpr Field kGradients = &MemoryBreakdown::gradients;

class PipelineReplay {
 public:
  PipelineReplay(const ModelSpec& model, const Layout& layout, const FSDPOptions& options, pp::Schedule schedule,
                 Plan& plan)
      : model_(model), stage_(model.pipeline), layout_(layout), options_(options), schedule_(schedule), plan_(plan) {
    for (const auto& unit : model_.units) flats_.push_back(flat_layout(unit, layout_));
    full_.assign(flats_.size(), false);
    arrived_.assign(flats_.size(), false);
    // The rank's chunks (the stage itself but when interleaved), each unit
    // at its place among the rank's units: the root is every chunk's, the
    // others are found by name (interleave_stages keeps them all).
    std::vector<const ModelSpec*> chunks{&model_};
    if (!model_.chunks.empty()) {
      chunks.clear();
      for (const ModelSpec& chunk : model_.chunks) chunks.push_back(&chunk);
    }
    for (const ModelSpec* chunk : chunks) {
      chunks_.push_back({chunk, {0}});
      for (size_t u = 1; u < chunk->units.size(); ++u) {
        const auto found = std::find_if(model_.units.begin() + 1, model_.units.end(),
                                        [&](const UnitSpec& unit) { return unit.name == chunk->units[u].name; });
        if (found == model_.units.end())
          throw std::logic_error("plan: a chunk's unit '" + chunk->units[u].name +
                                 "' is not among the rank's (a bug in dtrain plan)");
        chunks_.back().at.push_back(static_cast<size_t>(found - model_.units.begin()));
      }
    }
  }

  void run() {
    int64_t largest_piece = 0;
    for (size_t u = 0; u < model_.units.size(); ++u) {
      const int64_t numel = flats_[u].numel;
      if (layout_.ddp) {
        t_.add(&MemoryBreakdown::parameters, numel * 4);
        t_.add(&MemoryBreakdown::reduction_buffers, numel * 4);  // buckets
        t_.add(&MemoryBreakdown::optimizer_state, numel * 4 * layout_.optimizer_states);
        for (const auto& p : model_.units[u].parameters) largest_piece = std::max(largest_piece, p.numel);
        continue;
      }
      t_.add(&MemoryBreakdown::parameters, flats_[u].shard * layout_.master_bytes);
      for (int64_t count : flats_[u].local_counts) {
        t_.add(&MemoryBreakdown::optimizer_state, count * 4 * layout_.optimizer_states);
        largest_piece = std::max(largest_piece, count);
      }
      if (!fsdp_rules::free_after_backward(layout_.strategy)) gather(u);  // OptimizerOnly keeps them across steps
    }
    t_.add(&MemoryBreakdown::parameters, model_.buffer_bytes);
    plan_.between_steps = t_.now();
    t_.add(kActivations, model_.input_bytes);
    t_.mark("before the pipeline");
    if (!layout_.ddp) gather_for_step();

    int in_flight = 0;
    // The stage's forwards and backwards in Pipeline::step's order.
    const auto actions = pp::schedule_actions(schedule_, stage_.stage, stage_.stages,
                                              static_cast<int>(chunks_.size()), stage_.microbatches);
    for (size_t a = 0; a < actions.size(); ++a) {
      const pp::Action& action = actions[a];
      const Chunk& chunk = chunks_[static_cast<size_t>(action.chunk)];
      const int m = action.microbatch;
      if (action.forward) {
        forward(chunk, m);
        plan_.forward_activation_bytes = std::max(plan_.forward_activation_bytes, t_.now().activations);
        plan_.microbatches_in_flight = std::max(plan_.microbatches_in_flight, ++in_flight);
      } else {
        // DDP reduces in the step's last backward; when interleaved, the
        // other chunks' gradients join the buckets after it (as unused ones).
        backward(chunk, m, /*reducing=*/a + 1 == actions.size());
        --in_flight;
      }
    }
    t_.remove(kActivations, held_send_);  // the pipeline waits for its last sends
    held_send_ = 0;
    if (layout_.ddp) {
      for (size_t k = 1; k < chunks_.size(); ++k)
        for (size_t u = 0; u < chunks_[k].at.size(); ++u) bucket_arrival(chunks_[k].at[u]);
      t_.remove(kGradients, bucket_fill_.finish());
    } else {
      reduce_step_gradients();
    }
    t_.mark_with(kActivations, optimizer_temporary_bytes(layout_, largest_piece), "optimizer step");
    plan_.peak = t_.peak();
    plan_.peak_moment = t_.peak_moment();
  }

 private:
  // FSDP: a unit with parameters whose full buffer is not its shard.
  bool gathers(size_t u) const {
    return !model_.units[u].parameters.empty() &&
           !(layout_.group_size == 1 && layout_.compute_bytes == layout_.master_bytes);
  }
  int64_t full_bytes(size_t u) const { return flats_[u].padded * layout_.compute_bytes; }
  // A unit gathered as fp8 keeps its codes while gathered (Note [gathered float8 weights]).
  int64_t float8_codes_bytes(size_t u) const {
    return float8_record_bytes(model_, u, layout_, options_) > 0 ? flats_[u].padded : 0;
  }

  // One of the rank's model chunks: its description, and where each of its
  // units is among the rank's (at[u]).
  struct Chunk {
    const ModelSpec* spec;
    std::vector<size_t> at;
    const ModelSpec::PipelineStage& stage() const { return spec->pipeline; }
    // The chunk's tied embedding unit on an end stage (PipelineStage::tied_unit).
    bool tied(size_t u) const { return stage().tied_unit && u == stage().tied_unit_at; }
    // The rank's units the embedding's and the head's backward give
    // gradients: the root, and the tied embedding's unit where there is one.
    std::vector<size_t> embedding_units() const {
      if (!stage().tied_unit) return {0};
      return {0, at[stage().tied_unit_at]};
    }
    // The head's unit: the tied embedding's, or the root (gathered for the step).
    size_t head_unit() const { return stage().tied_unit ? at[stage().tied_unit_at] : 0; }
  };
  int64_t gradient_element_bytes() const { return layout_.ddp ? 4 : layout_.compute_bytes; }
  int64_t gradient_bytes(size_t u) const { return flats_[u].numel * gradient_element_bytes(); }
  std::string of(int m) const { return " of microbatch " + std::to_string(m); }

  // FSDPState::gather_for_step: every gather issued (with its source cast to
  // the compute dtype), then every one waited for.
  void gather_for_step() {
    int64_t sources = 0;
    for (size_t u = 0; u < flats_.size(); ++u) {
      if (u > 0 && per_microbatch()) continue;
      if (const int64_t record = float8_record_bytes(model_, u, layout_, options_); gathers(u) && record > 0)
        sources += record * (1 + layout_.group_size);  // Float8Gather's records, sent and received
      else if (gathers(u) && layout_.compute_bytes != layout_.master_bytes)
        sources += flats_[u].shard * layout_.compute_bytes;
      gather(u);
    }
    t_.mark_with(&MemoryBreakdown::gathered_parameters, sources,
                 per_microbatch() ? "the root gathered for the step" : "every unit gathered for the step");
  }
  bool per_microbatch() const { return !layout_.ddp && layout_.gather_per_microbatch; }
  // A unit's full buffer allocated (gathered), or freed.
  void gather(size_t u) {
    if (layout_.ddp || !gathers(u) || full_[u]) return;
    full_[u] = true;
    t_.add(&MemoryBreakdown::gathered_parameters, full_bytes(u) + float8_codes_bytes(u));
    const int gathered = static_cast<int>(std::count(full_.begin(), full_.end(), true));
    plan_.max_units_gathered = std::max(plan_.max_units_gathered, gathered);
    plan_.largest_unit_gathered_bytes = std::max(plan_.largest_unit_gathered_bytes, full_bytes(u));
  }
  void release(size_t u) {
    if (!full_[u]) return;
    full_[u] = false;
    t_.remove(&MemoryBreakdown::gathered_parameters, full_bytes(u) + float8_codes_bytes(u));
  }
  // Per microbatch: a non-root unit's gather before it runs, and its reshard after.
  void enter(size_t u) {
    if (per_microbatch() && u > 0) gather(u);
  }
  void leave_forward(size_t u) {
    if (per_microbatch() && fsdp_rules::reshard_after_forward(layout_.strategy, u == 0)) release(u);
  }
  void leave_backward(size_t u) {
    if (per_microbatch() && u > 0 && fsdp_rules::free_after_backward(layout_.strategy)) release(u);
  }

  void forward(const Chunk& c, int m) {
    const auto& stage = c.stage();
    const auto& spec = *c.spec;
    if (!stage.first()) t_.add(kActivations, stage.message_bytes);  // the activation received
    for (size_t u = 0; u < spec.units.size(); ++u) {
      if (stage.last() && c.tied(u)) continue;  // the head, below
      enter(c.at[u]);
      t_.add(kActivations, spec.units[u].activation_bytes);
      t_.mark("forward" + of(m) + ": " + display(spec.units[u]));
      leave_forward(c.at[u]);
    }
    if (!stage.last()) t_.add(kActivations, stage.output_bytes);  // kept until its backward
    if (stage.last()) {
      // ln_f's output, the log-probabilities kept for the loss's backward,
      // and for a moment the logits they came from.
      enter(c.head_unit());
      t_.add(kActivations, spec.root_tail_activation_bytes + spec.loss_bytes);
      t_.mark_with(kActivations, spec.output_bytes, "forward" + of(m) + ": the logits and the loss");
      leave_forward(c.head_unit());
    }
  }

  // The unit's gradients: created by the step's first backward, added into
  // by the later ones; in DDP's reducing backward each goes into its bucket
  // when the bucket completes.
  void gradients_of(size_t u, int64_t bytes, bool first_backward, bool reducing) {
    if (first_backward) t_.add(kGradients, bytes);
    if (!layout_.ddp || !reducing) return;
    if (bytes == gradient_bytes(u)) {
      bucket_arrival(u);
    } else {
      t_.remove(kGradients, bucket_fill_.arrive(bytes));
    }
  }
  // DDP: unit u's gradients copied into their buckets (the separate tensors
  // freed as each bucket completes).
  void bucket_arrival(size_t u) {
    if (arrived_[u]) return;  // the root of two chunks
    arrived_[u] = true;
    int64_t freed = 0;
    const auto& parameters = model_.units[u].parameters;
    for (auto p = parameters.rbegin(); p != parameters.rend(); ++p) freed += bucket_fill_.arrive(p->numel * 4);
    t_.remove(kGradients, freed);
  }

  void backward(const Chunk& c, int m, bool reducing) {
    const auto& stage = c.stage();
    const auto& spec = *c.spec;
    const bool first_backward = m == 0;
    if (!stage.last()) t_.add(kActivations, stage.message_bytes);  // the gradient received
    if (stage.last()) {
      // The loss's backward: the gradients of the log-probabilities and of
      // the logits together.
      t_.mark_with(kActivations, 2 * spec.output_bytes, "backward" + of(m) + ": the loss's gradients");
      enter(c.head_unit());
      t_.remove(kActivations, spec.root_tail_activation_bytes + spec.loss_bytes);
      // The head's and the final norm's gradients (the tied unit's and the root's).
      if (first_backward) {
        for (size_t u : c.embedding_units()) gradients_of(u, gradient_bytes(u), true, reducing);
      } else {
        t_.mark_with(kGradients, spec.root_tail_gradient_bytes, "backward" + of(m) + ": the head's gradients");
        if (reducing)
          for (size_t u : c.embedding_units()) gradients_of(u, gradient_bytes(u), false, true);
      }
      leave_backward(c.head_unit());
    }
    for (size_t u = spec.units.size() - 1; u >= 1; --u) {
      const auto& unit = spec.units[u];
      if (c.tied(u)) continue;  // its backward is the embedding's (first stage) or the head's (above)
      const size_t at = c.at[u];
      // After the first backward a weight's new gradient exists for a moment
      // before it is added into .grad.
      enter(at);
      int64_t accumulating = 0;
      if (!first_backward)
        for (const auto& p : unit.parameters) accumulating = std::max(accumulating, p.numel * gradient_element_bytes());
      t_.add(kGradients, accumulating);
      t_.mark_with(kActivations, unit.backward_workspace_bytes, "backward" + of(m) + ": " + display(unit));
      t_.remove(kGradients, accumulating);
      t_.remove(kActivations, unit.activation_bytes);
      gradients_of(at, gradient_bytes(at), first_backward, reducing);
      leave_backward(at);
    }
    if (stage.first()) {
      // The embeddings' backward: their gradients (GPT: wte's and wpe's; new ones after
      // the first microbatch, added into the others).
      const auto& root = spec.units[0];
      enter(c.head_unit());
      t_.mark_with(kActivations, root.backward_end_workspace_bytes, "backward" + of(m) + ": the embeddings");
      t_.remove(kActivations, root.activation_bytes);
      for (size_t u : c.embedding_units()) gradients_of(u, gradient_bytes(u), first_backward, reducing);
      leave_backward(c.head_unit());
    } else {
      // The input's gradient, sent back; the activation received is freed.
      t_.mark_with(kActivations, stage.message_bytes, "backward" + of(m) + ": the input's gradient");
      t_.remove(kActivations, stage.message_bytes);
    }
    if (!stage.last()) t_.remove(kActivations, stage.message_bytes + stage.output_bytes);  // and the output
    // The pipeline drops the previous backward's send (completed by now).
    t_.remove(kActivations, held_send_);
    held_send_ = stage.first() ? 0 : stage.message_bytes;
    t_.add(kActivations, held_send_);
  }

  // FSDPState::reduce_step_gradients.
  void reduce_step_gradients() {
    std::deque<size_t> reducing;
    std::vector<size_t> reduced;
    const auto finish_reduction = [&] {
      t_.remove(&MemoryBreakdown::reduction_buffers, flats_[reducing.front()].padded * layout_.reduce_bytes);
      reducing.pop_front();
    };
    for (size_t u = 0; u < model_.units.size(); ++u) {
      if (model_.units[u].parameters.empty()) continue;
      const auto& flat = flats_[u];
      while (fsdp_rules::must_wait_for_reduction(layout_.strategy, reducing.size(), options_.max_inflight_reductions))
        finish_reduction();
      t_.add(&MemoryBreakdown::reduction_buffers, flat.padded * layout_.reduce_bytes);
      t_.mark("end of the step: " + display(model_.units[u]) + " reduces its gradients");
      t_.remove(kGradients, gradient_bytes(u));
      if (!fsdp_rules::reduces_in_place(layout_.strategy)) {
        reducing.push_back(u);
        t_.add(kGradients, flat.shard * layout_.reduce_bytes);
      }
      reduced.push_back(u);
    }
    for (size_t u = 0; u < flats_.size(); ++u)
      if (fsdp_rules::free_after_backward(layout_.strategy)) release(u);
    // Unit::finish_gradients, in reduction order.
    for (size_t u : reduced) {
      const auto& flat = flats_[u];
      const bool cast = layout_.reduce_bytes != layout_.master_bytes;
      if (fsdp_rules::reduces_in_place(layout_.strategy)) {
        t_.remove(&MemoryBreakdown::reduction_buffers, flat.padded * layout_.reduce_bytes);
        t_.add(kGradients, cast ? flat.shard * layout_.master_bytes : flat.padded * layout_.reduce_bytes);
        continue;
      }
      if (!reducing.empty() && reducing.front() == u) finish_reduction();
      if (cast) {
        t_.add(kGradients, flat.shard * layout_.master_bytes);
        t_.mark("end of the step: gradients cast to the master dtype");
        t_.remove(kGradients, flat.shard * layout_.reduce_bytes);
      }
    }
  }

  const ModelSpec& model_;
  const ModelSpec::PipelineStage& stage_;
  const Layout& layout_;
  const FSDPOptions& options_;
  const pp::Schedule schedule_;
  Plan& plan_;
  std::vector<Chunk> chunks_;
  std::vector<FlatLayout> flats_;
  std::vector<bool> full_;  // FSDP: the unit's full buffer is allocated
  std::vector<bool> arrived_;  // DDP: the unit's gradients are in their buckets
  Timeline t_;
  DDPBucketFill bucket_fill_;
  int64_t held_send_ = 0;  // the input's gradient sent by the previous backward
};

}  // namespace

void simulate_pipeline_step(const ModelSpec& model, const Layout& layout, const FSDPOptions& fsdp,
                            pp::Schedule schedule, Plan& plan) {
  PipelineReplay(model, layout, fsdp, schedule, plan).run();
}

}  // namespace dtrain::plan::detail
