#include <dtrain/strategy_table.h>

#include <stdexcept>

namespace dtrain {

// Note [the strategy table]
// Each row states what its strategy supports; the checks and the dispatch
// read the flags, so a feature one strategy lacks is refused in one place
// (src/train/check_config.cpp) with the reason, and a new strategy inherits
// every check by setting its flags. The parameter server's rows say no to
// --grad-clip (no rank sees the global gradient), --on-nonfinite skip (the
// servers apply a push at once) and checkpoints (the optimizer state lives on
// the servers and is not saved yet): see check_config.cpp for the messages.
const std::vector<StrategyInfo>& strategy_table() {
  static const std::vector<StrategyInfo> table = [] {
    std::vector<StrategyInfo> rows;
    rows.push_back({.name = "single", .description = "one process, the whole model", .engine = StrategyEngine::SingleProcess,
                    .multi_rank = false, .bf16 = true});
    rows.push_back({.name = "ddp", .description = "a full replica per rank, gradients all-reduced during backward",
                    .engine = StrategyEngine::DDP, .compression = true, .bf16 = true, .balance = true, .planned = true,
                    .aliases = {"none"}});
    auto sharded = [](const char* name, const char* description, Sharding sharding, std::vector<const char*> aliases) {
      return StrategyInfo{.name = name, .description = description, .engine = StrategyEngine::FSDP,
                          .sharding = sharding, .fsdp_compression = true, .bf16 = true, .planned = true,
                          .deferred_construction = true,
                          .aliases = std::move(aliases)};
    };
    rows.push_back(sharded("zero1", "ZeRO-1: optimizer state sharded", Sharding::OptimizerOnly, {"optimizer"}));
    rows.push_back(sharded("zero2", "ZeRO-2: gradients and optimizer state sharded", Sharding::GradOp, {"gradop"}));
    rows.push_back(sharded("fsdp", "fully sharded (ZeRO-3): parameters, gradients and optimizer state",
                           Sharding::Full, {"full", "zero3"}));
    rows.push_back(sharded("hsdp", "hybrid: fully sharded inside groups, replicated across them", Sharding::Hybrid,
                           {"hybrid"}));
    auto parameter_server = [](const char* name, const char* description, Synchrony synchrony) {
      return StrategyInfo{.name = name, .description = description, .engine = StrategyEngine::ParameterServer,
                          .synchrony = synchrony, .balance = synchrony == Synchrony::Lockstep,
                          .backup_workers = synchrony == Synchrony::Lockstep};
    };
    rows.push_back(parameter_server("ps-sync", "parameter server, synchronous steps", Synchrony::Lockstep));
    rows.push_back(parameter_server("ps-async", "parameter server, asynchronous pushes", Synchrony::Asynchronous));
    rows.push_back(parameter_server("ps-ssp", "parameter server, stale-synchronous (bounded --staleness)",
                                    Synchrony::BoundedStaleness));
    return rows;
  }();
  return table;
}

const StrategyInfo* find_strategy(std::string_view name) {
  for (const auto& row : strategy_table()) {
    if (name == row.name) return &row;
    for (const char* alias : row.aliases)
      if (name == alias) return &row;
  }
  return nullptr;
}

const StrategyInfo& strategy_info(std::string_view name) {
  if (const StrategyInfo* row = find_strategy(name)) return *row;
  throw std::invalid_argument("unknown strategy '" + std::string(name) + "'; one of " + strategy_list());
}

const StrategyInfo& strategy_of(Sharding sharding) {
  if (sharding == Sharding::None) return strategy_info("ddp");
  for (const auto& row : strategy_table())
    if (row.engine == StrategyEngine::FSDP && row.sharding == sharding) return row;
  throw std::logic_error("strategy_of: no strategy row for this sharding");
}

std::string strategy_list(bool (*keep)(const StrategyInfo&)) {
  std::string text;
  for (const auto& row : strategy_table()) {
    if (keep && !keep(row)) continue;
    text += (text.empty() ? "" : ", ") + std::string(row.name);
  }
  return text;
}

void require_fsdp_engine(const std::string& strategy, const std::string& what) {
  if (strategy_info(strategy).engine == StrategyEngine::FSDP) return;
  throw std::invalid_argument(what + ": it needs --strategy " +
                              strategy_list([](const StrategyInfo& r) { return r.engine == StrategyEngine::FSDP; }) +
                              ", not " + strategy);
}

}  // namespace dtrain
