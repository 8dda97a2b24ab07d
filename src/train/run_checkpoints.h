// A training run's checkpoints, the same for every training loop: when one
// is due, saving it with the run's description, and --resume (find and load
// the newest valid checkpoint, say what was loaded and what this run
// changes, and give the step to continue at).
#pragma once

#include "dtrain/comm.h"
#include "dtrain/train.h"
#include "train/checkpointing.h"
#include "train/metrics.h"

#include <cstdint>

namespace dtrain::train {

// Collective over `world`. Without config.resume returns 0 and loads nothing.
// Otherwise loads through `load` (resume_from_latest), prints on `printing`
// which checkpoints were passed over and which one was loaded with the
// settings this run changes, records resumed_from_step in `result` and the
// metrics, and returns the checkpoint's step (0 when the folder holds none
// yet). Throws std::invalid_argument when the checkpoint is past `total`.
int64_t resume_run(const TrainConfig& config, int64_t total, const LoadCheckpoint& load, const CommPtr& world,
                   bool printing, MetricsWriter& metrics, TrainResult& result);

// Whether a checkpoint is due once the run has gone from `before` to `done`
// steps: at each multiple of --checkpoint-every reached or jumped over (a
// late ps-sync worker jumps ahead) and at the last step. Never without
// --checkpoint-dir.
bool checkpoint_due(const TrainConfig& config, int64_t before, int64_t done, int64_t total);

// Collective over `world`: saves step `step` of a run of `total` steps
// through `save` (save_training_checkpoint, with the run's description).
// Throws std::runtime_error naming the step and, when `last_saved` > 0, the
// checkpoint that is still intact.
void save_run_checkpoint(const TrainConfig& config, int64_t step, int64_t total, int64_t last_saved,
                         const SaveCheckpoint& save, const CommPtr& world);

}  // namespace dtrain::train
