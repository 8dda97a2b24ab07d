// `dtrain plan --search`: the layouts of a run on --nproc ranks (strategy,
// (dp, pp, cp, tp) mesh, sequence parallelism, microbatches and schedule,
// activation checkpointing, prefetch, compression) that dtrain train accepts
// and that fit a rank's memory, ranked by predicted tokens/s (Note [layout
// search], plan_search.cpp).
#pragma once

#include "plan.h"

#include "dtrain/plan.h"

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::cli {

struct LayoutRow {
  std::vector<std::string> train_flags;  // exactly what dtrain train takes for this layout
  plan::StepTime time;                   // the slowest rank's step (every stage's, under --pp)
  double tokens_per_second = 0;
  int64_t peak_bytes = 0;                // the largest of every planned rank's (every stage's) peak
};

struct SearchResult {
  std::vector<LayoutRow> rows;  // fitting and accepted, fastest first
  int64_t memory_limit = 0;
  int candidates = 0;           // layouts enumerated
  int refused = 0;              // not planned or refused by dtrain train's checks
  int over_memory = 0;
  double seconds = 0;           // the search's own time
};

// `flags` holds the model and the run (its --nproc, --batch-size, --link,
// ...); its layout flags are the search's to choose. Throws
// std::invalid_argument without --link or for a memory limit that does not parse.
SearchResult search_layouts(const PlanFlags& flags);

// The model's and the run's flags for dtrain train, followed by a row's.
std::vector<std::string> run_flags(const PlanFlags& flags);

int print_search(const PlanFlags& flags);

}  // namespace dtrain::cli
