// How FSDP splits a model's state over ranks (dtrain::Sharding), apart from
// the engine's header so that light code (the strategy table, checkpoint
// manifests, the planner's vocabulary) can name it without LibTorch.
#pragma once

#include <string>

namespace dtrain {

enum class Sharding {
  Full,           // ZeRO-3: parameters, gradients, optimizer state sharded; reshard after forward
  GradOp,         // ZeRO-2: as Full, but parameters stay gathered from forward to backward
  OptimizerOnly,  // ZeRO-1: gradients all-reduced, parameters kept gathered, optimizer state sharded
  None,           // DDP through the same machinery (nothing sharded)
  Hybrid,         // Full inside groups of hybrid_group_size ranks, replicated across groups
};
const char* to_string(Sharding sharding);
// "full"/"fsdp"/"zero3", "gradop"/"zero2", "optimizer"/"zero1", "none"/"ddp", "hybrid"/"hsdp".
Sharding sharding_from_string(const std::string& name);

}  // namespace dtrain
