// The closing line about memory: what each rank held, next to what
// `dtrain plan` says the same run would need under DDP.
#pragma once

#include "dtrain/train.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::train {

// "memory per rank: 1.2 MiB measured ..., dtrain plan: ... under DDP (2.9x)";
// nullopt for single and ddp (nothing to compare) or a model the planner
// does not describe.
std::optional<std::string> memory_summary(const TrainConfig& config, int world_size,
                                          const std::vector<int64_t>& peak_bytes_per_rank);

}  // namespace dtrain::train
