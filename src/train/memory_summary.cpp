#include "train/memory_summary.h"

#include "dtrain/plan.h"
#include "train/model.h"
#include "train/plan_model.h"
#include "train/progress.h"
#include "dtrain/strategy_table.h"
#include "train/strategy.h"

#include <algorithm>
#include <cstdio>

namespace dtrain::train {

plan::Plan plan_for(const TrainConfig& config, const std::string& strategy, int world_size) {
  // Under --tp the engine runs over the dp groups, each rank holding its tp
  // slice; under --cp over dp x cp, the cp ranks of a group sharing its batch part.
  const int cp = std::max(config.cp, 1);
  const int dp = world_size / (std::max(config.tp, 1) * cp);
  plan::PlanOptions options;
  plan::set_strategy(options, strategy);
  const bool sharded = strategy_info(strategy).engine == StrategyEngine::FSDP;
  if (sharded) {
    options.fsdp = fsdp_options({.name = strategy, .compress = "none", .mixed_precision = config.mixed_precision,
                                 .fsdp_compress = config.fsdp_compress,
                                 .activation_checkpointing = config.activation_checkpointing},
                                dp * cp);
  }
  options.world_size = dp * cp;
  options.rank = 0;
  options.optimizer = plan::optimizer_from(config.optimizer, config.momentum);
  options.init_from = !config.init_from.empty();
  options.checkpoint_async = config.checkpoint_async;
  const int64_t batch_per_rank = (config.batch_size + dp - 1) / dp;
  const auto compute = sharded ? options.fsdp.mixed_precision.param_dtype : torch::kFloat32;
  // The spec's description only: a probe would allocate and run the model (plan_model.h).
  return plan::make_plan(plan_model(config, batch_per_rank, compute, /*probe=*/false).model, options);
}

std::string construction_advice(const TrainConfig& config, int world_size) {
  const std::string plan_command = "`dtrain plan` with this run's flags shows the start's peak next to a step's";
  if (builds_deferred(config.strategy)) {
    return "Each rank builds only its shards of the model (plus one module at full size at a time): use more ranks "
           "(--nproc), or raise the cap; " + plan_command + ".";
  }
  return "Under --strategy " + config.strategy + " every rank builds the whole model" +
         (world_size > 1 ? " and receives rank 0's copy of it" : std::string()) +
         ": shard it (--strategy fsdp builds each unit straight into this rank's shards), or raise the cap; " +
         plan_command + ".";
}

std::string step_advice(const TrainConfig& config) {
  if (builds_deferred(config.strategy)) {
    const Sharding sharding = strategy_info(config.strategy).sharding;
    const std::string full_sharding = sharding == Sharding::OptimizerOnly || sharding == Sharding::GradOp
                                          ? "--strategy fsdp (it frees each unit's gathered weights after its forward), "
                                          : "";
    const std::string recompute = model_spec(config).checkpointable_blocks && !config.activation_checkpointing && config.tp == 1 &&
                                          config.pp == 1
                                      ? "--activation-checkpointing on, "
                                      : "";
    return "Use " + full_sharding + "more ranks (--nproc), a smaller --batch-size, --mixed-precision bf16, " + recompute +
           "or raise the cap; `dtrain plan` shows what each moment of a step holds.";
  }
  return "Shard the model (--strategy fsdp), use more ranks, a smaller --batch-size, or raise the cap.";
}

std::optional<std::string> memory_summary(const TrainConfig& config, int world_size, const TrainResult& result) {
  // The planner does not describe the stages of a run with --pp (their
  // summary would be per stage) or a ring's recompute yet.
  if (strategy_info(config.strategy).engine != StrategyEngine::FSDP || result.peak_memory_bytes_per_rank.empty() ||
      config.pp > 1 || (config.cp > 1 && config.activation_checkpointing))
    return std::nullopt;
  try {
    const plan::Plan planned = plan_for(config, config.strategy, world_size);
    const int64_t ddp = plan_for(config, "ddp", world_size).overall_peak_bytes();
    const int64_t measured = result.peak_memory_bytes;
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2fx", static_cast<double>(ddp) / static_cast<double>(std::max<int64_t>(measured, 1)));
    // The measured step peak also covers evaluation and sampling; the plan is of one training step.
    const std::string mesh =
        config.cp > 1   ? " as (dp=" + std::to_string(world_size / (config.tp * config.cp)) + ", cp=" +
                              std::to_string(config.cp) + ", tp=" + std::to_string(config.tp) + ")"
        : config.tp > 1 ? " as (dp=" + std::to_string(world_size / config.tp) + ", tp=" + std::to_string(config.tp) + ")"
                        : "";
    return "memory per rank: " + format_bytes(measured) + " at most (" + config.strategy + " on " +
           std::to_string(world_size) + " ranks" + mesh + ": start " + format_bytes(result.construction_peak_bytes) + ", steps " +
           format_bytes(result.step_peak_bytes) + "; dtrain plan predicted start " +
           format_bytes(planned.construction.total()) + ", a training step " + format_bytes(planned.peak.total()) +
           "); DDP would need " + format_bytes(ddp) + " per rank (dtrain plan), " + ratio + " as much";
  } catch (const std::exception&) {
    return std::nullopt;  // a configuration the planner does not describe: say nothing rather than guess
  }
}

}  // namespace dtrain::train
