// The strategies of `dtrain train --strategy`, one row each: the one place
// that knows what a strategy name means. The CLI's choices, the config
// checks, the trainer's dispatch, the memory summary, `dtrain plan` and the
// checkpoint manifest all read it; none compares strategy names itself.
//
// Adding a strategy: one row in src/common/strategy_table.cpp (its flags say
// which run features it supports) and its engine in src/train/strategy.cpp.
// LibTorch-free, so that light code (manifest validation) can use it.
#pragma once

#include <dtrain/sharding.h>

#include <string>
#include <string_view>
#include <vector>

namespace dtrain {

// What trains the model.
enum class StrategyEngine {
  SingleProcess,    // one process, no communication
  DDP,              // a full replica per rank, gradients all-reduced in buckets during backward
  FSDP,             // dtrain::FullyShardedBase with `sharding`
  ParameterServer,  // workers push gradients to server ranks and pull parameters (dtrain/ps.h)
};

// When an update uses which gradients.
enum class Synchrony {
  Lockstep,          // every update averages every rank's gradient of the same step
  BoundedStaleness,  // a worker runs at most --staleness steps ahead of the slowest (SSP)
  Asynchronous,      // each push is applied as it arrives
};

struct StrategyInfo {
  const char* name;         // what --strategy, `dtrain plan` and checkpoint manifests say
  const char* description;  // one line, for --help and errors
  StrategyEngine engine;
  Sharding sharding = Sharding::None;  // FSDP engine only
  Synchrony synchrony = Synchrony::Lockstep;
  bool multi_rank = true;              // false: exactly one process
  bool compression = false;            // --compress (DDP's gradient communication hooks)
  bool fsdp_compression = false;       // --fsdp-compress (FSDP's compressed all-gathers and reduce-scatters)
  bool bf16 = false;                   // --mixed-precision bf16 (bf16 compute, fp32 master weights)
  bool grad_clip = true;               // --grad-clip (a global gradient norm exists)
  bool nonfinite_skip = true;          // --on-nonfinite skip (ranks agree before the update)
  bool trace = true;                   // --trace
  bool checkpoints = true;             // --checkpoint-dir, --resume
  bool balance = false;                // --balance (re-split a synchronous global batch)
  bool backup_workers = false;         // --backup-workers
  bool planned = false;                // `dtrain plan` models its memory and traffic
  bool deferred_construction = false;  // each rank builds only its shards of the model (issue 15)
  std::vector<const char*> aliases = {};  // other names that mean it (older manifests, FSDP's own)
};

// Every row, in the order to show them.
const std::vector<StrategyInfo>& strategy_table();

// The row named `name` (or one of its aliases); nullptr when none is.
const StrategyInfo* find_strategy(std::string_view name);

// As find_strategy; throws std::invalid_argument "unknown strategy 'X'; one
// of single, ddp, ..." when none is.
const StrategyInfo& strategy_info(std::string_view name);

// The row of the FSDP engine with `sharding` (Sharding::None: ddp's row,
// which is what FSDP without sharding computes).
const StrategyInfo& strategy_of(Sharding sharding);

// "single, ddp, zero1, ..." (the rows for which `keep` is true; all by default).
std::string strategy_list(bool (*keep)(const StrategyInfo&) = nullptr);

// For a flag only the FSDP engine acts on: throws std::invalid_argument
// "<what>: it needs --strategy zero1, zero2, fsdp, hsdp, not <strategy>"
// unless `strategy` runs on that engine (dtrain train and dtrain plan alike).
void require_fsdp_engine(const std::string& strategy, const std::string& what);
// What --activation-checkpointing on with another engine is refused for.
inline constexpr const char* kActivationCheckpointingNeedsFsdp =
    "--activation-checkpointing on recomputes each FSDP unit's forward in its backward";

}  // namespace dtrain
