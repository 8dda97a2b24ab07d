#include "train/memory_summary.h"

#include "dtrain/plan.h"
#include "train/model.h"
#include "train/progress.h"
#include "train/strategy.h"

#include <algorithm>
#include <cstdio>

namespace dtrain::train {
namespace {

// Rank 0's plan (it holds the most) for `strategy` on `world_size` ranks.
int64_t planned_peak(const TrainConfig& config, const std::string& strategy, int world_size) {
  plan::PlanOptions options;
  plan::set_strategy(options, strategy);
  if (strategy != "ddp") {
    options.fsdp = fsdp_options({.name = strategy, .compress = "none", .mixed_precision = config.mixed_precision},
                                world_size);
  }
  options.world_size = world_size;
  options.rank = 0;
  options.optimizer = plan::optimizer_from(config.optimizer, config.momentum);
  const int64_t batch_per_rank = (config.batch_size + world_size - 1) / world_size;
  const auto compute = strategy == "ddp" ? torch::kFloat32 : options.fsdp.mixed_precision.param_dtype;
  const auto model = plan::describe_model(config.model, gpt_config(config), config.mlp_hidden, batch_per_rank, compute);
  return plan::make_plan(model, options).peak.total();
}

}  // namespace

std::optional<std::string> memory_summary(const TrainConfig& config, int world_size,
                                          const std::vector<int64_t>& peak_bytes_per_rank) {
  if (config.strategy == "single" || config.strategy == "ddp" || peak_bytes_per_rank.empty()) return std::nullopt;
  try {
    const int64_t measured = *std::max_element(peak_bytes_per_rank.begin(), peak_bytes_per_rank.end());
    const int64_t planned = planned_peak(config, config.strategy, world_size);
    const int64_t ddp = planned_peak(config, "ddp", world_size);
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2fx", static_cast<double>(ddp) / static_cast<double>(std::max<int64_t>(measured, 1)));
    // The measured peak also covers evaluation and sampling; the plan is of one training step.
    return "memory per rank: " + format_bytes(measured) + " at most (" + config.strategy + " on " +
           std::to_string(world_size) + " ranks; dtrain plan predicted " + format_bytes(planned) +
           " for a training step); DDP would need " + format_bytes(ddp) + " per rank (dtrain plan), " + ratio +
           " as much";
  } catch (const std::exception&) {
    return std::nullopt;  // a configuration the planner does not describe: say nothing rather than guess
  }
}

}  // namespace dtrain::train
