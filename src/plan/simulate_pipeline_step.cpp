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
//   separate tensor is freed (src/ddp/reducer.cpp, mark_ready).
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
    // The stage's forwards and backwards in Pipeline::step's order (one
    // chunk per rank: the plan does not model interleaving).
    for (const pp::Action& action :
         pp::schedule_actions(schedule_, stage_.stage, stage_.stages, /*chunks=*/1, stage_.microbatches)) {
      const int m = action.microbatch;
      if (action.forward) {
        forward(m);
        plan_.forward_activation_bytes = std::max(plan_.forward_activation_bytes, t_.now().activations);
        plan_.microbatches_in_flight = std::max(plan_.microbatches_in_flight, ++in_flight);
      } else {
        backward(m);
        --in_flight;
      }
    }
    t_.remove(kActivations, held_send_);  // the pipeline waits for its last sends
    held_send_ = 0;
    if (layout_.ddp) {
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
  // The tied embedding's unit on the end stages (ModelSpec::PipelineStage::tied_unit).
  bool tied(size_t u) const { return stage_.tied_unit && u == 1; }
  // The units the embedding's and the head's backward give gradients: the
  // root, and the tied embedding's unit where there is one.
  size_t embedding_units() const { return stage_.tied_unit ? 2 : 1; }
  // The head's unit: the tied embedding's, or the root (gathered for the step).
  size_t head_unit() const { return stage_.tied_unit ? 1 : 0; }
  int64_t gradient_element_bytes() const { return layout_.ddp ? 4 : layout_.compute_bytes; }
  int64_t gradient_bytes(size_t u) const { return flats_[u].numel * gradient_element_bytes(); }
  std::string of(int m) const { return " of microbatch " + std::to_string(m); }

  // FSDPState::gather_for_step: every gather issued (with its source cast to
  // the compute dtype), then every one waited for.
  void gather_for_step() {
    int64_t sources = 0;
    for (size_t u = 0; u < flats_.size(); ++u) {
      if (u > 0 && per_microbatch()) continue;
      if (gathers(u) && layout_.compute_bytes != layout_.master_bytes) sources += flats_[u].shard * layout_.compute_bytes;
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
    t_.add(&MemoryBreakdown::gathered_parameters, full_bytes(u));
    const int gathered = static_cast<int>(std::count(full_.begin(), full_.end(), true));
    plan_.max_units_gathered = std::max(plan_.max_units_gathered, gathered);
    plan_.largest_unit_gathered_bytes = std::max(plan_.largest_unit_gathered_bytes, full_bytes(u));
  }
  void release(size_t u) {
    if (!full_[u]) return;
    full_[u] = false;
    t_.remove(&MemoryBreakdown::gathered_parameters, full_bytes(u));
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

  void forward(int m) {
    if (!stage_.first()) t_.add(kActivations, stage_.message_bytes);  // the activation received
    for (size_t u = 0; u < model_.units.size(); ++u) {
      if (stage_.last() && tied(u)) continue;  // the head, below
      enter(u);
      t_.add(kActivations, model_.units[u].activation_bytes);
      t_.mark("forward" + of(m) + ": " + display(model_.units[u]));
      leave_forward(u);
    }
    if (!stage_.last()) t_.add(kActivations, stage_.output_bytes);  // kept until its backward
    if (stage_.last()) {
      // ln_f's output, the log-probabilities kept for the loss's backward,
      // and for a moment the logits they came from.
      enter(head_unit());
      t_.add(kActivations, model_.root_tail_activation_bytes + model_.loss_bytes);
      t_.mark_with(kActivations, model_.output_bytes, "forward" + of(m) + ": the logits and the loss");
      leave_forward(head_unit());
    }
  }

  // The unit's gradients: created by the step's first backward, added into
  // by the later ones; in DDP's last backward each goes into its bucket
  // when the bucket completes.
  void gradients_of(size_t u, int64_t bytes, bool first_backward, bool last_backward) {
    if (first_backward) t_.add(kGradients, bytes);
    if (!layout_.ddp || !last_backward) return;
    int64_t freed = 0;
    if (bytes == gradient_bytes(u)) {
      const auto& parameters = model_.units[u].parameters;
      for (auto p = parameters.rbegin(); p != parameters.rend(); ++p) freed += bucket_fill_.arrive(p->numel * 4);
    } else {
      freed += bucket_fill_.arrive(bytes);
    }
    t_.remove(kGradients, freed);
  }

  void backward(int m) {
    const bool first_backward = m == 0, last_backward = m == stage_.microbatches - 1;
    if (!stage_.last()) t_.add(kActivations, stage_.message_bytes);  // the gradient received
    if (stage_.last()) {
      // The loss's backward: the gradients of the log-probabilities and of
      // the logits together.
      t_.mark_with(kActivations, 2 * model_.output_bytes, "backward" + of(m) + ": the loss's gradients");
      enter(head_unit());
      t_.remove(kActivations, model_.root_tail_activation_bytes + model_.loss_bytes);
      // The head's and the final norm's gradients (the tied unit's and the root's).
      if (first_backward) {
        for (size_t u = 0; u < embedding_units(); ++u) gradients_of(u, gradient_bytes(u), true, last_backward);
      } else {
        t_.mark_with(kGradients, model_.root_tail_gradient_bytes, "backward" + of(m) + ": the head's gradients");
        if (last_backward)
          for (size_t u = 0; u < embedding_units(); ++u) gradients_of(u, gradient_bytes(u), false, true);
      }
      leave_backward(head_unit());
    }
    for (size_t u = model_.units.size() - 1; u >= 1; --u) {
      const auto& unit = model_.units[u];
      if (tied(u)) continue;  // its backward is the embedding's (first stage) or the head's (above)
      // After the first backward a weight's new gradient exists for a moment
      // before it is added into .grad.
      enter(u);
      int64_t accumulating = 0;
      if (!first_backward)
        for (const auto& p : unit.parameters) accumulating = std::max(accumulating, p.numel * gradient_element_bytes());
      t_.add(kGradients, accumulating);
      t_.mark_with(kActivations, unit.backward_workspace_bytes, "backward" + of(m) + ": " + display(unit));
      t_.remove(kGradients, accumulating);
      t_.remove(kActivations, unit.activation_bytes);
      gradients_of(u, gradient_bytes(u), first_backward, last_backward);
      leave_backward(u);
    }
    if (stage_.first()) {
      // The embeddings' backward: their gradients (GPT: wte's and wpe's; new ones after
      // the first microbatch, added into the others).
      const auto& root = model_.units[0];
      enter(head_unit());
      t_.mark_with(kActivations, root.backward_end_workspace_bytes, "backward" + of(m) + ": the embeddings");
      t_.remove(kActivations, root.activation_bytes);
      for (size_t u = 0; u < embedding_units(); ++u) gradients_of(u, gradient_bytes(u), first_backward, last_backward);
      leave_backward(head_unit());
    } else {
      // The input's gradient, sent back; the activation received is freed.
      t_.mark_with(kActivations, stage_.message_bytes, "backward" + of(m) + ": the input's gradient");
      t_.remove(kActivations, stage_.message_bytes);
    }
    if (!stage_.last()) t_.remove(kActivations, stage_.message_bytes + stage_.output_bytes);  // and the output
    // The pipeline drops the previous backward's send (completed by now).
    t_.remove(kActivations, held_send_);
    held_send_ = stage_.first() ? 0 : stage_.message_bytes;
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
  std::vector<FlatLayout> flats_;
  std::vector<bool> full_;  // FSDP: the unit's full buffer is allocated
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
