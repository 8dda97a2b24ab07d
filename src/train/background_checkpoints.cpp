#include "train/background_checkpoints.h"

#include "train/checkpointing.h"
#include "train/run_report.h"

#include <stdexcept>
#include <string>

namespace dtrain::train {

BackgroundCheckpoints::BackgroundCheckpoints(const TrainConfig& config, int64_t total, int64_t last_saved,
                                             const CommPtr& world)
    : config_(config), total_(total), world_(world), last_saved_(last_saved), writer_(world) {}

void BackgroundCheckpoints::flush() {
  const int64_t step = writer_.in_flight();
  if (step == 0) return;
  try {
    writer_.wait();
  } catch (const std::exception& error) {
    // The words of a failed blocking save (save_run_checkpoint).
    throw std::runtime_error("cannot write the checkpoint of step " + std::to_string(step) + " (in the background): " +
                             error.what() +
                             (last_saved_ > 0 ? "; the checkpoint of step " + std::to_string(last_saved_) + " is untouched"
                                              : std::string()));
  }
  last_saved_ = step;
}

void BackgroundCheckpoints::save(int64_t step, const HeldModel& held, torch::optim::Optimizer* optimizer) {
  flush();
  auto extra = with_random_states(run_description(config_, total_), world_);
  const bool pruning = world_->rank() == 0;
  // Pruning waits for the new checkpoint to be in place, as after a blocking
  // save; it only touches the folder, on rank 0, so the writer thread does it.
  writer_.save(checkpoint_path(config_.checkpoint_dir, step), held, optimizer, step, extra,
               [pruning, dir = config_.checkpoint_dir, keep = config_.keep_last] {
                 if (pruning) prune_checkpoints(dir, keep);
               });
}

}  // namespace dtrain::train
