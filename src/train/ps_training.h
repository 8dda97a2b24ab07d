// --strategy ps-sync | ps-async | ps-ssp: training through the parameter
// server (include/dtrain/ps.h) instead of a Strategy that wraps the model.
//
// The last config.servers ranks run a ps::Server; the others are workers that
// run the shared StepLoop (step_loop.h) through a ps::Worker, whose push and
// pull is a step's update, on their part of each global batch
// (data::DistributedSampler over the workers only). The loss scaling is Note
// [global batch loss]'s with W = the number of workers.
//
// Lockstep: ps-sync without backup workers keeps the workers in step, so the
// loss is the global batch's (an all-reduce over the workers), --eval-every
// and --balance work, and the losses equal ddp's on W ranks. In ps-async,
// ps-ssp and ps-sync with backup workers a per-step collective would put the
// workers back in lockstep, so the loss reported is rank 0's own part's mean
// and the run evaluates once, after every worker has finished (when they all
// hold the servers' final parameters).
#pragma once

#include "dtrain/comm.h"
#include "dtrain/train.h"

#include <string>

namespace dtrain::train {

bool is_parameter_server(const std::string& strategy);

// run_training's body for the ps-* strategies (config already checked).
TrainResult run_parameter_server(const TrainConfig& config, CommPtr world);

}  // namespace dtrain::train
