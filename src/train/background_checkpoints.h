// A run's checkpoints with --checkpoint-async: the step that checkpoints
// stages its state in host memory and goes on; the checkpoint is written,
// fsynced and published by a writer thread (src/checkpoint/async_save.h,
// Note [the writer's own communicator]) with the same layout, manifest and
// crash consistency as a blocking save. A save in flight lives in
// DIR/step-NNNNNNNN.tmp-N, which --resume and --max-restarts never take for
// a checkpoint: until it is renamed into place, the previous one is the
// newest. The next save, the end of the run and a stop signal wait for it.
#pragma once

#include "checkpoint/async_save.h"
#include "dtrain/comm.h"
#include "dtrain/train.h"

#include <cstdint>

namespace dtrain::train {

class BackgroundCheckpoints {
 public:
  // Collective over `world` (the writer's communicator is split from it).
  // `last_saved`: the step of the checkpoint the run resumed from (0: none).
  BackgroundCheckpoints(const TrainConfig& config, int64_t total, int64_t last_saved, const CommPtr& world);

  // Collective over `world`, on the training thread: waits for the save in
  // flight, adds every rank's random state, stages `held` (and its
  // optimizer state) and starts writing the checkpoint of `step`. Throws
  // what save_run_checkpoint throws when the save in flight failed.
  void save(int64_t step, const HeldModel& held, torch::optim::Optimizer* optimizer);
  // Waits for the save in flight (the end of the run, a stop signal);
  // throws as save() does.
  void flush();
  int64_t staging_bytes() const { return writer_.staging_bytes(); }

 private:
  const TrainConfig& config_;
  const int64_t total_;
  const CommPtr world_;
  int64_t last_saved_;  // the newest checkpoint known to be in place
  detail::BackgroundCheckpointWriter writer_;
};

}  // namespace dtrain::train
