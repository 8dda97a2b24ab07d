// One training step replayed as the engines run it, counting bytes.
//
// Note [memory plan]
// A steady-state step (the optimizer state exists, .grad was set to none by
// the previous zero_grad) is replayed event by event: each allocation adds
// to one category of MemoryBreakdown, each free removes, and the largest
// total at any marked moment is the plan's peak. The rules (flat layout and
// padding, when a unit is resharded or freed, the prefetch bound, when
// backward waits for a reduction, in-place or scattered reduction) are the
// engine's own, src/fsdp/schedule_rules.h; the order of the events mirrors
// the code, so a change to that order must be mirrored here (tests/plan and
// `dtrain bench fsdp` compare the result with the tracking allocator):
// - FSDP (src/fsdp/fsdp_state.cpp, unit.cpp, flat_parameter.cpp):
//   * a unit's shard is padded/G elements of the master dtype, its full
//     buffer padded elements of the compute dtype; a one-rank group in the
//     master dtype gathers nothing (the full buffer is the shard);
//   * forward: the root is gathered first and kept until its own backward
//     ends; each other unit is gathered when entered, the next one in
//     forward order is prefetched while fewer than max_inflight_all_gathers
//     gathers are outstanding, and Full/Hybrid free it after its forward;
//     GradOp and OptimizerOnly keep it;
//   * backward (pre prefetch): entering a unit gathers it again if freed and
//     prefetches the previous one; its parameters' gradients arrive in the
//     compute dtype at full size; after the last one the unit allocates a
//     zeroed full-size buffer in the reduce dtype, copies the gradients in
//     (freeing them), and reduce-scatters it into a new shard-sized buffer
//     (OptimizerOnly: all-reduces it in place); then it frees its full
//     parameters (OptimizerOnly keeps them, across steps too);
//   * a unit keeps its full-size reduction buffer until backward waits for
//     that reduction: when max_inflight_reductions newer ones would be
//     outstanding (before the next buffer is allocated) or in the
//     end-of-backward callback (Unit::finish_gradients), where the shard
//     gradient becomes .grad. OptimizerOnly all-reduces in place and .grad
//     is a view into the full buffer, which lives until zero_grad;
//   * optimizer state is allocated per parameter piece, so a shard's
//     padding has none.
// - DDP (src/ddp/reducer.cpp): the full replica, one zeroed bucket buffer
//   per parameter element made at construction; .grad is a view into the
//   bucket (DDPOptions::gradient_as_bucket_view), so after zero_grad()'s
//   set_to_none each gradient is a fresh tensor only until its bucket is
//   complete (copied in, then freed). Buckets fill in backward's order with
//   the default caps (DDPBucketFill below).
// - Activations: each unit's saved tensors are added in forward and
//   removed during its backward (ModelSpec, src/plan/describe_model.cpp).
//   The root runs first and last: its tail (after its children) is undone
//   first, and the gradients that tail produces stay until the root's own
//   backward ends.
// - Activation checkpointing (FSDPOptions::activation_checkpointing;
//   src/fsdp/activation_checkpoint.cpp): every unit but the root runs its
//   forward under no-grad, keeping its input and a copy of the CPU
//   generator's state. The replay counts checkpointed_activation_bytes per
//   unit from its forward to its backward instead of activation_bytes, and
//   the generator states until the end of backward (the autograd graph
//   holds them until it is freed). A unit's output is freed when the next
//   unit's backward ends (before this unit's backward gathers it); its
//   backward then holds one more generator state and activation_bytes again
//   (the recompute), of which its recomputed output stays until its
//   gradients are reduced (the reductions run inside the recompute's
//   backward).
// - Optimizer step: AdamW computes sqrt(exp_avg_sq) / bias-correction into
//   two temporaries of one parameter's size; SGD allocates none.
#include "plan/plan_internal.h"
#include "plan/replay.h"
#include "plan/step_clock.h"
#include "fsdp/schedule_rules.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <deque>
#include <stdexcept>
#include <string>

namespace dtrain::plan::detail {
namespace {

// ---------------------------------------------------------------- FSDP

// The bytes of the tensor the CPU generator's state is saved in
// (get_state(), which activation checkpointing calls per unit).
int64_t generator_state_bytes() {
  static const int64_t bytes = static_cast<int64_t>(at::detail::createCPUGenerator().get_state().nbytes());
  return bytes;
}

struct UnitState {
  FlatLayout flat;
  bool full_is_shard = false;
  bool allocated = false;  // the full buffer has bytes
  bool in_flight = false;  // an all-gather was issued and not waited for
  bool using_full = false;
  int64_t float8_record = 0;  // float8_record_bytes: gathered as fp8 when > 0
  bool float8_codes = false;  // the gathered fp8 codes held for dtrain::linear
};

class FSDPReplay {
 public:
  FSDPReplay(const ModelSpec& model, const Layout& layout, const FSDPOptions& options, Plan& plan)
      : model_(model), layout_(layout), options_(options), plan_(plan), costs_(model, layout, options),
        clock_(layout) {
    for (const auto& unit : model_.units) {
      UnitState state;
      state.flat = flat_layout(unit, layout_);
      state.full_is_shard = unit.parameters.empty() ||
                            (layout_.group_size == 1 && layout_.compute_bytes == layout_.master_bytes);
      // OptimizerOnly never frees a gathered buffer: from the previous step on it is there.
      state.allocated = !state.full_is_shard && !free_after_backward();
      state.float8_record = float8_record_bytes(model_, units_.size(), layout_, options_);
      units_.push_back(state);
    }
    gathered_at_.assign(units_.size(), 0);
  }

  void run() {
    int64_t largest_piece = 0;
    for (size_t u = 0; u < units_.size(); ++u) {
      const auto& flat = units_[u].flat;
      t_.add(&MemoryBreakdown::parameters, flat.shard * layout_.master_bytes);
      for (int64_t count : flat.local_counts) {
        t_.add(&MemoryBreakdown::optimizer_state, count * 4 * layout_.optimizer_states);
        largest_piece = std::max(largest_piece, count);
      }
      if (units_[u].allocated) t_.add(&MemoryBreakdown::gathered_parameters, full_bytes(u));
    }
    t_.add(&MemoryBreakdown::parameters, model_.buffer_bytes);
    count_gathered();
    plan_.between_steps = t_.now();
    t_.add(&MemoryBreakdown::activations, model_.input_bytes);
    t_.mark("before forward");

    forward();
    backward();

    t_.mark_with(&MemoryBreakdown::activations, optimizer_temporary_bytes(layout_, largest_piece),
                 "optimizer step");
    plan_.peak = t_.peak();
    plan_.peak_moment = t_.peak_moment();
    clock_.in_line(costs_.model_collectives, [] { return std::string("the model's own collectives"); });
    clock_.compute(costs_.optimizer, [] { return std::string("optimizer step"); });
    if (costs_.predicted) plan_.time = clock_.finish();
  }

 private:
  bool free_after_backward() const { return fsdp_rules::free_after_backward(layout_.strategy); }
  // FSDPState::forward_unit: every unit but the root, when asked for.
  bool checkpointed(size_t u) const { return options_.activation_checkpointing && u != 0; }
  bool reshard_after_forward(size_t u) const { return fsdp_rules::reshard_after_forward(layout_.strategy, u == 0); }
  int64_t full_bytes(size_t u) const { return units_[u].flat.padded * layout_.compute_bytes; }
  // The shard cast to the compute dtype for the gather (shard.to() copies
  // only when the dtypes differ).
  // Gathered as fp8 (Unit::start_unshard): this rank's record and every
  // rank's, received.
  int64_t gather_source_bytes(size_t u) const {
    if (units_[u].float8_record > 0) return units_[u].float8_record * (1 + layout_.group_size);
    return layout_.compute_bytes == layout_.master_bytes ? 0 : units_[u].flat.shard * layout_.compute_bytes;
  }

  void count_gathered() {
    int gathered = 0;
    for (size_t u = 0; u < units_.size(); ++u) {
      if (units_[u].allocated) {
        ++gathered;
        plan_.largest_unit_gathered_bytes = std::max(plan_.largest_unit_gathered_bytes, full_bytes(u));
      }
    }
    plan_.max_units_gathered = std::max(plan_.max_units_gathered, gathered);
  }

  // Unit::start_unshard
  bool start_unshard(size_t u) {
    auto& unit = units_[u];
    if (unit.in_flight || unit.using_full || unit.full_is_shard) return false;
    if (!unit.allocated) {
      unit.allocated = true;
      t_.add(&MemoryBreakdown::gathered_parameters, full_bytes(u));
    }
    t_.add(&MemoryBreakdown::gathered_parameters, gather_source_bytes(u));
    unit.in_flight = true;
    gathered_at_[u] = clock_.issue(costs_.gather[u], [&] { return "all-gather " + display(model_.units[u]); },
                                   costs_.gather_bytes[u]);
    count_gathered();
    t_.mark("all-gather of " + display(model_.units[u]) + " issued");
    return true;
  }
  // Unit::finish_unshard
  void finish_unshard(size_t u) {
    auto& unit = units_[u];
    if (!unit.in_flight && !unit.using_full) start_unshard(u);
    if (unit.in_flight) {
      unit.in_flight = false;
      if (const int64_t record = unit.float8_record; record > 0) {
        // Float8Gather::decode: the sent record freed, every rank's codes
        // copied out of the received records and kept while the unit is
        // gathered (Note [gathered float8 weights]).
        t_.remove(&MemoryBreakdown::gathered_parameters, record);
        t_.add(&MemoryBreakdown::gathered_parameters, unit.flat.padded);
        unit.float8_codes = true;
        t_.mark("fp8 weights of " + display(model_.units[u]) + " decoded");
        t_.remove(&MemoryBreakdown::gathered_parameters, record * layout_.group_size);
      } else {
        t_.remove(&MemoryBreakdown::gathered_parameters, gather_source_bytes(u));
      }
      clock_.wait(gathered_at_[u]);
      clock_.compute(costs_.gather_casts[u], [] { return std::string("compressed records read"); });
    }
    unit.using_full = true;
  }
  // Unit::reshard
  void reshard(size_t u, bool free_full) {
    auto& unit = units_[u];
    if (unit.in_flight) {
      unit.in_flight = false;
      t_.remove(&MemoryBreakdown::gathered_parameters, gather_source_bytes(u));
    }
    if (unit.float8_codes) {
      unit.float8_codes = false;
      t_.remove(&MemoryBreakdown::gathered_parameters, unit.flat.padded);
    }
    unit.using_full = false;
    if (free_full && unit.allocated && !unit.full_is_shard) {
      unit.allocated = false;
      t_.remove(&MemoryBreakdown::gathered_parameters, full_bytes(u));
    }
  }
  // FSDPState::prefetch and consume
  void prefetch(int u) {
    if (u < 0 || !fsdp_rules::may_prefetch(inflight_, options_.max_inflight_all_gathers)) return;
    if (start_unshard(static_cast<size_t>(u))) ++inflight_;
  }
  void consume(size_t u) {
    if (units_[u].in_flight) --inflight_;
    finish_unshard(u);
  }
  // The unit run before (-1) or after (+1) u in forward order; units_[0]
  // is the root, the rest are in forward order.
  int neighbour(size_t u, int direction) const {
    const int last = static_cast<int>(units_.size()) - 1;
    if (u == 0) return direction < 0 && last >= 1 ? last : -1;
    const int index = static_cast<int>(u) + direction;
    return index >= 1 && index <= last ? index : -1;
  }

  void forward() {
    for (size_t u = 0; u < units_.size(); ++u) reshard(u, free_after_backward());
    inflight_ = 0;
    if (start_unshard(0)) ++inflight_;
    if (options_.forward_prefetch && units_.size() > 1) prefetch(1);
    consume(0);
    t_.add(&MemoryBreakdown::activations, model_.units[0].activation_bytes);
    t_.mark("forward: the root");
    clock_.compute(costs_.forward[0], [] { return std::string("forward: the root"); });
    for (size_t u = 1; u < units_.size(); ++u) {
      if (start_unshard(u)) ++inflight_;
      if (options_.forward_prefetch) prefetch(neighbour(u, +1));
      consume(u);
      if (checkpointed(u))  // its input is kept, and the generator's state
        t_.add(&MemoryBreakdown::activations, model_.units[u].checkpointed_activation_bytes + generator_state_bytes());
      else
        t_.add(&MemoryBreakdown::activations, model_.units[u].activation_bytes);
      t_.mark("forward: " + display(model_.units[u]));
      clock_.compute(costs_.forward[u], [&] { return "forward: " + display(model_.units[u]); });
      if (reshard_after_forward(u)) reshard(u, true);
    }
    clock_.compute(costs_.tail, [] { return std::string("forward: head and loss"); });
    t_.add(&MemoryBreakdown::activations,
           model_.root_tail_activation_bytes + model_.output_bytes + model_.loss_bytes);
    t_.mark("end of forward (with the loss)");
    plan_.forward_activation_bytes = t_.now().activations;
  }

  void backward() {
    // The loss's backward: the gradients of the log-probabilities and of the
    // output live together, then the output's stays for the root's tail.
    t_.add(&MemoryBreakdown::activations, model_.output_bytes);
    t_.mark_with(&MemoryBreakdown::activations, model_.output_bytes, "backward: the loss's gradients");
    pre_backward(0);
    clock_.compute(2 * costs_.tail, [] { return std::string("backward: loss and head"); });
    t_.remove(&MemoryBreakdown::activations,
              model_.output_bytes + model_.loss_bytes + model_.root_tail_activation_bytes);
    t_.add(&MemoryBreakdown::gradients, model_.root_tail_gradient_bytes);
    std::vector<size_t> reduced;
    int64_t generator_states = 0;
    for (size_t u = units_.size() - 1; u >= 1; --u) {
      const auto& spec = model_.units[u];
      // Its output went with the next unit's recompute (or the root's tail).
      if (checkpointed(u)) t_.remove(&MemoryBreakdown::activations, spec.checkpointed_activation_bytes);
      pre_backward(u);
      if (checkpointed(u)) {  // the recompute, and the generator's state of the moment
        t_.add(&MemoryBreakdown::activations, spec.activation_bytes + generator_state_bytes());
        t_.mark("backward: " + display(spec) + " recomputes its forward");
        clock_.compute(costs_.forward[u], [&] { return "recompute: " + display(spec); });
      }
      clock_.compute(costs_.backward(u), [&] { return "backward: " + display(spec); });
      unit_backward(u);
      if (checkpointed(u)) {
        t_.remove(&MemoryBreakdown::activations, spec.checkpointed_activation_bytes + generator_state_bytes());
        generator_states += generator_state_bytes();
      }
      reduced.push_back(u);
    }
    clock_.compute(costs_.backward(0), [] { return std::string("backward: the root"); });
    unit_backward(0);
    reduced.push_back(0);
    finalize(reduced);
    t_.remove(&MemoryBreakdown::activations, generator_states);  // the graph is freed
  }

  void pre_backward(size_t u) {
    if (start_unshard(u)) ++inflight_;
    if (options_.backward_prefetch == BackwardPrefetch::Pre) prefetch(neighbour(u, -1));
    consume(u);
  }

  // The unit's gradients are computed, then FSDPState::on_gradient_ready's
  // last call reduces them.
  void unit_backward(size_t u) {
    const auto& spec = model_.units[u];
    const auto& flat = units_[u].flat;
    if (spec.parameters.empty()) {  // no gradients to wait for: nothing is reduced
      t_.remove(&MemoryBreakdown::activations,
                spec.activation_bytes - (checkpointed(u) ? spec.checkpointed_activation_bytes : 0));
      return;
    }
    t_.add(&MemoryBreakdown::gradients, spec.gradients_at_workspace_peak * layout_.compute_bytes);
    t_.mark_with(&MemoryBreakdown::activations, spec.backward_workspace_bytes, "backward: " + display(spec));
    t_.remove(&MemoryBreakdown::gradients, spec.gradients_at_workspace_peak * layout_.compute_bytes);
    // Recomputed: its output stays until the recompute's backward returns.
    t_.remove(&MemoryBreakdown::activations,
              spec.activation_bytes - (checkpointed(u) ? spec.checkpointed_activation_bytes : 0));
    t_.mark_with(&MemoryBreakdown::activations, spec.backward_end_workspace_bytes,
                 "backward: " + display(spec) + " computes its last gradients");
    t_.add(&MemoryBreakdown::gradients, flat.numel * layout_.compute_bytes);
    if (u == 0) t_.remove(&MemoryBreakdown::gradients, model_.root_tail_gradient_bytes);  // now part of the root's
    // FSDPState::bound_inflight_reductions, then Unit::reduce_gradients
    while (fsdp_rules::must_wait_for_reduction(layout_.strategy, reducing_.size(), options_.max_inflight_reductions))
      finish_reduction();
    if (!fsdp_rules::reduces_in_place(layout_.strategy)) reducing_.push_back(u);
    clock_.compute(costs_.reduce_casts[u], [] { return std::string("compressed records made"); });
    reduced_at_.push_back(clock_.issue(costs_.reduce[u], [&] { return "reduce " + display(spec); },
                                       costs_.reduce_bytes[u]));
    t_.add(&MemoryBreakdown::reduction_buffers, flat.padded * layout_.reduce_bytes);
    t_.mark("backward: " + display(spec) + " reduces its gradients");
    t_.remove(&MemoryBreakdown::gradients, flat.numel * layout_.compute_bytes);
    if (!fsdp_rules::reduces_in_place(layout_.strategy)) {
      t_.add(&MemoryBreakdown::gradients, flat.shard * layout_.reduce_bytes);
      t_.mark("backward: " + display(spec) + " reduce-scatters");
    }
    reshard(u, free_after_backward());
    if (options_.backward_prefetch == BackwardPrefetch::Post) prefetch(neighbour(u, -1));
  }

  // Backward waited for the oldest reduce-scatter and dropped its full-size buffer.
  void finish_reduction() {
    const auto& flat = units_[reducing_.front()].flat;
    t_.remove(&MemoryBreakdown::reduction_buffers, flat.padded * layout_.reduce_bytes);
    clock_.wait(reduced_at_[reduced_at_.size() - reducing_.size()]);
    reducing_.pop_front();
  }

  // FSDPState::finalize_backward -> Unit::finish_gradients, in issue order.
  void finalize(const std::vector<size_t>& reduced) {
    clock_.wait_all();  // every reduction, before .grad is set
    for (size_t u : reduced) {
      if (model_.units[u].parameters.empty()) continue;
      const auto& flat = units_[u].flat;
      const int64_t full = flat.padded * layout_.reduce_bytes;
      const bool cast = layout_.reduce_bytes != layout_.master_bytes;
      if (fsdp_rules::reduces_in_place(layout_.strategy)) {
        if (cast) {
          t_.add(&MemoryBreakdown::gradients, flat.shard * layout_.master_bytes);
          t_.mark("end of backward: gradients cast to the master dtype");
          t_.remove(&MemoryBreakdown::reduction_buffers, full);
        } else {
          // .grad is a view into the all-reduced buffer.
          t_.remove(&MemoryBreakdown::reduction_buffers, full);
          t_.add(&MemoryBreakdown::gradients, full);
        }
        continue;
      }
      if (!reducing_.empty() && reducing_.front() == u) finish_reduction();
      if (cast) {
        t_.add(&MemoryBreakdown::gradients, flat.shard * layout_.master_bytes);
        t_.mark("end of backward: gradients cast to the master dtype");
        t_.remove(&MemoryBreakdown::gradients, flat.shard * layout_.reduce_bytes);
      }
    }
  }

  const ModelSpec& model_;
  const Layout& layout_;
  const FSDPOptions& options_;
  Plan& plan_;
  std::vector<UnitState> units_;
  Timeline t_;
  int inflight_ = 0;
  std::deque<size_t> reducing_;  // units whose reduce-scatter may still hold its full-size buffer
  // The time (Note [step time]).
  StepCosts costs_;
  StepClock clock_;
  std::vector<double> gathered_at_;  // per unit: when its last all-gather issued completes
  std::vector<double> reduced_at_;   // per reduction issued, in order: when it completes
};

// ---------------------------------------------------------------- DDP

void replay_ddp(const ModelSpec& model, const Layout& layout, Plan& plan) {
  Timeline t;
  const StepCosts costs(model, layout, FSDPOptions{});
  StepClock clock(layout);
  int64_t largest = 0;
  for (const auto& unit : model.units) {
    t.add(&MemoryBreakdown::parameters, unit.numel() * 4);
    t.add(&MemoryBreakdown::reduction_buffers, unit.numel() * 4);  // buckets
    t.add(&MemoryBreakdown::optimizer_state, unit.numel() * 4 * layout.optimizer_states);
    for (const auto& p : unit.parameters) largest = std::max(largest, p.numel);
  }
  t.add(&MemoryBreakdown::parameters, model.buffer_bytes);
  plan.between_steps = t.now();
  t.add(&MemoryBreakdown::activations, model.input_bytes);
  t.mark("before forward");
  for (size_t u = 0; u < model.units.size(); ++u) {
    t.add(&MemoryBreakdown::activations, model.units[u].activation_bytes);
    t.mark("forward: " + display(model.units[u]));
    clock.compute(costs.forward[u], [&] { return "forward: " + display(model.units[u]); });
  }
  clock.compute(costs.tail, [] { return std::string("forward: head and loss"); });
  t.add(&MemoryBreakdown::activations, model.root_tail_activation_bytes + model.output_bytes + model.loss_bytes);
  t.mark("end of forward (with the loss)");
  plan.forward_activation_bytes = t.now().activations;
  t.add(&MemoryBreakdown::activations, model.output_bytes);
  t.mark_with(&MemoryBreakdown::activations, model.output_bytes, "backward: the loss's gradients");
  t.remove(&MemoryBreakdown::activations, model.output_bytes + model.loss_bytes + model.root_tail_activation_bytes);
  t.add(&MemoryBreakdown::gradients, model.root_tail_gradient_bytes);
  DDPBucketFill fill;
  clock.compute(2 * costs.tail, [] { return std::string("backward: loss and head"); });
  int64_t freed = fill.arrive(model.root_tail_gradient_bytes);
  auto unit_backward = [&](const UnitSpec& unit) {
    clock.compute(costs.backward(static_cast<size_t>(&unit - &model.units[0])),
                  [&] { return "backward: " + display(unit); });
    t.add(&MemoryBreakdown::gradients, unit.gradients_at_workspace_peak * 4);
    t.mark_with(&MemoryBreakdown::activations, unit.backward_workspace_bytes, "backward: " + display(unit));
    t.remove(&MemoryBreakdown::gradients, unit.gradients_at_workspace_peak * 4);
    t.remove(&MemoryBreakdown::activations, unit.activation_bytes);
    t.mark_with(&MemoryBreakdown::activations, unit.backward_end_workspace_bytes,
                "backward: " + display(unit) + " computes its last gradients");
    t.add(&MemoryBreakdown::gradients, unit.numel() * 4);
    if (&unit == &model.units[0]) {
      t.remove(&MemoryBreakdown::gradients, model.root_tail_gradient_bytes);
      freed += fill.arrive(unit.numel() * 4 - model.root_tail_gradient_bytes);  // the root's others, as one
    } else {
      for (auto p = unit.parameters.rbegin(); p != unit.parameters.rend(); ++p) freed += fill.arrive(p->numel * 4);
    }
    t.mark("backward: " + display(unit) + " has its gradients");
    t.remove(&MemoryBreakdown::gradients, freed);  // copied into complete buckets
    if (freed > 0)  // the bucket's all-reduce
      clock.issue(costs.bucket(freed), [] { return std::string("all-reduce of a gradient bucket"); }, freed);
    freed = 0;
  };
  for (size_t u = model.units.size() - 1; u >= 1; --u) unit_backward(model.units[u]);
  unit_backward(model.units[0]);
  const int64_t last_bucket = fill.finish();
  t.remove(&MemoryBreakdown::gradients, last_bucket);
  if (last_bucket > 0)
    clock.issue(costs.bucket(last_bucket), [] { return std::string("all-reduce of a gradient bucket"); }, last_bucket);
  t.mark_with(&MemoryBreakdown::activations, optimizer_temporary_bytes(layout, largest), "optimizer step");
  plan.peak = t.peak();
  plan.peak_moment = t.peak_moment();
  clock.in_line(costs.model_collectives, [] { return std::string("the model's own collectives"); });
  clock.compute(costs.optimizer, [] { return std::string("optimizer step"); });
  if (costs.predicted) plan.time = clock.finish();
}

}  // namespace

FlatLayout flat_layout(const UnitSpec& unit, const Layout& layout) {
  const int64_t G = layout.group_size;
  FlatLayout flat;
  flat.numel = unit.numel();
  if (unit.parameters.empty()) return flat;  // nothing to gather or reduce (FlatParameter's empty case)
  const auto sizes = fsdp_rules::flat_sizes(flat.numel, G);  // as FlatParameter lays it out
  flat.padded = sizes.padded;
  flat.shard = sizes.shard;
  const int64_t begin = layout.group_rank * flat.shard, end = begin + flat.shard;
  int64_t offset = 0;
  for (const auto& p : unit.parameters) {
    const int64_t lo = std::clamp(begin, offset, offset + p.numel), hi = std::clamp(end, offset, offset + p.numel);
    flat.local_counts.push_back(hi - lo);
    offset += p.numel;
  }
  return flat;
}

void simulate_step(const ModelSpec& model, const Layout& layout, const FSDPOptions& fsdp, Plan& plan) {
  if (layout.ddp) {
    replay_ddp(model, layout, plan);
    return;
  }
  FSDPReplay(model, layout, fsdp, plan).run();
}

}  // namespace dtrain::plan::detail
