#include "train/run_checkpoints.h"

#include "train/run_report.h"

#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::train {

int64_t resume_run(const TrainConfig& config, int64_t total, const LoadCheckpoint& load, const CommPtr& world,
                   bool printing, MetricsWriter& metrics, TrainResult& result) {
  if (!config.resume) return 0;
  std::vector<std::string> rejected;
  const auto manifest = resume_from_latest(config.checkpoint_dir, load, world, &rejected);
  if (printing) {
    for (const auto& reason : rejected) std::cout << "not resuming from " << reason << "\n";
    if (!manifest) {
      std::cout << "no checkpoint in " << config.checkpoint_dir << " yet: starting at step 0" << std::endl;
    } else {
      std::cout << "resuming from step " << manifest->step << " ("
                << checkpoint_path(config.checkpoint_dir, manifest->step) << ", saved by " << manifest->strategy
                << " on " << manifest->world_size << (manifest->world_size == 1 ? " rank" : " ranks") << ")"
                << std::endl;
      for (const auto& line : resume_differences(manifest->extra, run_description(config, total)))
        std::cout << "  note: " << line << "\n";
    }
  }
  if (!manifest) return 0;
  if (manifest->step > total)
    throw std::invalid_argument("the checkpoint to resume from is at step " + std::to_string(manifest->step) +
                                ", past this run's " + std::to_string(total) + " steps: give more --steps");
  result.resumed_from_step = manifest->step;
  metrics.write({{"resumed_from_step", manifest->step}});
  return manifest->step;
}

bool checkpoint_due(const TrainConfig& config, int64_t before, int64_t done, int64_t total) {
  if (config.checkpoint_dir.empty()) return false;
  if (done >= total) return true;
  return config.checkpoint_every > 0 && done / config.checkpoint_every > before / config.checkpoint_every;
}

void save_run_checkpoint(const TrainConfig& config, int64_t step, int64_t total, int64_t last_saved,
                         const SaveCheckpoint& save, const CommPtr& world) {
  try {
    save_training_checkpoint(config.checkpoint_dir, step, config.keep_last, save, world, run_description(config, total));
  } catch (const std::exception& error) {
    throw std::runtime_error("cannot write the checkpoint of step " + std::to_string(step) + ": " + error.what() +
                             (last_saved > 0 ? "; the checkpoint of step " + std::to_string(last_saved) + " is untouched"
                                             : std::string()));
  }
}

}  // namespace dtrain::train
