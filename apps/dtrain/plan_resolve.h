// `dtrain plan`'s flags resolved into a model description and PlanOptions
// (apps/dtrain/plan.cpp), for the plan itself and for --search.
#pragma once

#include "plan.h"

#include "dtrain/plan.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::cli {

struct Resolved {
  plan::ModelSpec model;
  plan::PlanOptions options;  // over the data-parallel ranks (nproc / (pp x tp))
  int64_t global_batch = 0;
  std::string optimizer;
  int nproc = 1, tp = 1, pp = 1, cp = 1;
  int dp = 1;                 // the data-parallel groups (the engine runs over dp x cp)
  int rank = 0;               // in the world
  // --pp: the model of each stage (the planned rank's is `model`).
  std::vector<plan::ModelSpec> stages;
  std::string activations;  // where the activations came from (train::PlannedModel)
  int64_t tokens_per_sample = 1;  // seq_len for a model of token sequences
  bool timed() const { return options.link.bytes_per_second > 0; }  // --link given: the step is timed
  // --link: how fast the model's kernels ran against the probes' rates (1: not measured; plan_time.h)
  double kernel_efficiency = 1;
};

// Throws std::invalid_argument for flags dtrain train would refuse or the
// planner does not model. `rates`: the compute rates to time the step at
// (with --link), instead of --gemm-gflops / --memory-gbps or the probes.
Resolved resolve(const PlanFlags& flags, const std::optional<plan::ComputeRates>& rates = std::nullopt);

// The planned rank's step time: make_plan's, or for --pp every stage's
// together (plan::pipeline_step_times). Not predicted without --link.
plan::StepTime step_time(const Resolved& r, const plan::Plan& p);

// Tokens (samples, for a model of no token sequences) per step over all ranks.
int64_t tokens_per_step(const Resolved& r);

}  // namespace dtrain::cli
