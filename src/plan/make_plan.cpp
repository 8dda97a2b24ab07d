// make_plan: options checked and resolved, then the step replayed
// (simulate_step.cpp) and its collectives counted (collectives.cpp).
#include "plan/plan_internal.h"

#include <dtrain/strategy_table.h>

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

namespace dtrain::plan {

int64_t MemoryBreakdown::total() const {
  return parameters + gathered_parameters + gradients + reduction_buffers + optimizer_state + activations +
         checkpoint_staging;
}

int64_t Plan::overall_peak_bytes() const { return std::max(peak.total(), construction.total()); }

void set_strategy(PlanOptions& options, const std::string& name) {
  const StrategyInfo* row = find_strategy(name);
  if (!row || row->name != name || !row->planned)
    throw std::invalid_argument("unknown strategy '" + name + "'; allowed: " + strategy_list([](const StrategyInfo& r) {
                                  return r.planned;
                                }));
  if (row->engine == StrategyEngine::DDP) {
    options.engine = Engine::DDP;
    return;
  }
  options.engine = Engine::FSDP;
  options.fsdp.strategy = row->sharding;
}

std::string strategy_name(const PlanOptions& options) {
  if (options.engine == Engine::DDP) return "ddp";
  if (options.fsdp.strategy == Sharding::None) return "none";  // FSDP without sharding: no --strategy of its own
  return strategy_of(options.fsdp.strategy).name;
}

namespace detail {

Layout resolve_layout(const PlanOptions& options) {
  if (options.world_size < 1)
    throw std::invalid_argument("plan: the world size must be at least 1, got " + std::to_string(options.world_size));
  if (options.rank < 0 || options.rank >= options.world_size)
    throw std::invalid_argument("plan: rank " + std::to_string(options.rank) + " is outside a world of " +
                                std::to_string(options.world_size));
  if (options.fsdp.max_inflight_all_gathers < 1)
    throw std::invalid_argument("plan: max_inflight_all_gathers must be at least 1");
  if (options.fsdp.max_inflight_reductions < 1)
    throw std::invalid_argument("plan: max_inflight_reductions must be at least 1");
  detail::Layout layout;
  layout.ddp = options.engine == Engine::DDP;
  layout.strategy = options.fsdp.strategy;
  layout.world_size = options.world_size;
  layout.rank = options.rank;
  layout.optimizer_states = options.optimizer == Optimizer::AdamW ? 2 : options.optimizer == Optimizer::SGDMomentum ? 1 : 0;
  layout.gather_per_microbatch = options.gather_per_microbatch;
  layout.compute = options.compute;
  layout.link = options.link;
  layout.model_link = options.model_link;
  layout.explain = options.explain;
  if (options.fsdp.float8_all_gather && options.float8.scaling == Float8Scaling::Tensorwise)
    layout.float8_gather = options.float8;
  if (layout.ddp) {
    layout.group_size = 1;
    layout.replicas = options.world_size;
    return layout;
  }
  const auto& mp = options.fsdp.mixed_precision;
  for (auto dtype : {mp.param_dtype, mp.reduce_dtype, mp.output_dtype}) {
    if (!c10::isFloatingType(dtype))
      throw std::invalid_argument("plan: mixed precision dtypes must be floating point");
  }
  layout.compute_bytes = static_cast<int64_t>(c10::elementSize(mp.param_dtype));
  layout.reduce_bytes = static_cast<int64_t>(c10::elementSize(mp.reduce_dtype));
  const int world = options.world_size, rank = options.rank;
  switch (options.fsdp.strategy) {  // FSDPState::build_groups
    case Sharding::Full:
    case Sharding::GradOp:
    case Sharding::OptimizerOnly:
      layout.group_size = world;
      layout.group_rank = rank;
      break;
    case Sharding::None:
      layout.group_size = 1;
      layout.replicas = world;
      break;
    case Sharding::Hybrid: {
      const int group = options.fsdp.hybrid_group_size;
      if (group < 1 || world % group != 0)
        throw std::invalid_argument("plan: the hybrid group size must divide the world size " + std::to_string(world) +
                                    " (got " + std::to_string(group) + ")");
      layout.group_size = group;
      layout.group_rank = rank % group;
      layout.replicas = world / group;
      break;
    }
  }
  return layout;
}

}  // namespace detail

Plan make_plan(const ModelSpec& model, const PlanOptions& options) {
  if (model.units.empty()) throw std::invalid_argument("plan: the model has no units (units[0] must be the root)");
  const auto layout = detail::resolve_layout(options);
  if (options.fsdp.activation_checkpointing) {
    if (layout.ddp)
      throw std::invalid_argument("plan: activation checkpointing is the FSDP engine's (FSDPOptions::"
                                  "activation_checkpointing); DDP keeps every unit's activations");
    if (model.pipeline.stages > 1)
      throw std::invalid_argument("plan: activation checkpointing on a pipeline stage is not modelled (its units run "
                                  "gathered for the whole step, without the recompute)");
    for (size_t u = 1; u < model.units.size(); ++u)
      if (model.units[u].activation_bytes > 0 && model.units[u].checkpointed_activation_bytes <= 0)
        throw std::invalid_argument("plan: activation checkpointing is not modelled for " + model.description +
                                    " (unit '" + model.units[u].name + "' does not say what it keeps)");
  }
  Plan plan;
  plan.strategy = strategy_name(options);
  plan.world_size = layout.world_size;
  plan.shard_group_size = layout.group_size;
  plan.rank = layout.rank;
  for (const auto& unit : model.units) {
    const auto flat = detail::flat_layout(unit, layout);
    const bool gathered = !layout.ddp && !unit.parameters.empty() &&
                          !(layout.group_size == 1 && layout.compute_bytes == layout.master_bytes);
    plan.units.push_back(
        {unit.name, flat.numel, flat.padded, flat.shard, gathered ? flat.padded * layout.compute_bytes : 0});
  }
  if (model.pipeline.stages > 1) {
    if ((options.schedule == pp::Schedule::Interleaved) != !model.chunks.empty())
      throw std::invalid_argument(model.chunks.empty()
                                      ? "plan: the interleaved schedule runs a rank's chunks (plan::interleave_stages)"
                                      : "plan: a rank's interleaved chunks run under the interleaved schedule only");
    detail::simulate_pipeline_step(model, layout, options.fsdp, options.schedule, plan);
  } else {
    detail::simulate_step(model, layout, options.fsdp, plan);
  }
  detail::simulate_construction(model, layout, options.init_from, plan);
  detail::count_collectives(model, layout, options.fsdp, plan);
  if (options.checkpoint_async) {
    const int64_t staging = detail::checkpoint_staging_bytes(model, layout, options.optimizer);
    plan.peak.checkpoint_staging = staging;
    plan.between_steps.checkpoint_staging = staging;
  }
  return plan;
}

}  // namespace dtrain::plan
