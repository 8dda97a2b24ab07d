// The closing line about memory: what each rank held, next to what
// `dtrain plan` says the same run would need under DDP.
#pragma once

#include "dtrain/plan.h"
#include "dtrain/train.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::train {

// "memory per rank: 1.2 MiB measured ..., dtrain plan: ... under DDP (2.9x)";
// nullopt for single and ddp (nothing to compare) or a model the planner
// does not describe.
std::optional<std::string> memory_summary(const TrainConfig& config, int world_size, const TrainResult& result);

// The plan of rank 0 (it holds the most) for `strategy` on `world_size`
// ranks, as `config` runs it (throws for what the planner does not describe).
plan::Plan plan_for(const TrainConfig& config, const std::string& strategy, int world_size);

// What to say, with the out-of-memory message, when the start of `config`'s
// run does not fit, and when a step does not.
std::string construction_advice(const TrainConfig& config, int world_size);
std::string step_advice(const TrainConfig& config);

}  // namespace dtrain::train
