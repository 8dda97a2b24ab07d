// What `dtrain plan` and the end-of-run memory summary know of --model: its
// spec's description (ModelSpec::plan_description) or, for a model that has
// none, one read from the model itself.
#pragma once

#include "dtrain/plan.h"
#include "dtrain/train.h"

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace dtrain::train {

struct PlannedModel {
  plan::ModelSpec model;
  // Where the activations came from, for the plan's output: "described by
  // the model's spec", or "measured: ..." (the probe's batches).
  std::string activations;
};

// config.model at `batch_per_rank` samples per rank computing in `compute`.
// Without the spec's plan_description and with `probe`: the parameters
// exactly (names and sizes from the model built deferred; one unit, the root,
// unless the model declares dtrain::Sharded<> units), the buffers and the
// batch's bytes; the activations and the backward's workspace measured by
// the tracking allocator over one forward and backward at two small batches
// of the training data, and extrapolated linearly to batch_per_rank (Note
// [probe plan]). Throws std::invalid_argument when neither is possible
// (no description and !probe, or a compute dtype other than fp32 for the probe).
// The plan's name for the model: its spec's description of it.
std::string describe_model_for_plan(const TrainConfig& config);

// `data_parallel_ranks`: the ranks the strategy runs over (layers that
// compute otherwise on several ranks are probed that way). `probe_always`:
// measure even a model its spec describes (`dtrain plan --probe`, a check
// of the description).
PlannedModel plan_model(const TrainConfig& config, int64_t batch_per_rank, torch::ScalarType compute, bool probe,
                        int data_parallel_ranks = 1, bool probe_always = false);

}  // namespace dtrain::train
