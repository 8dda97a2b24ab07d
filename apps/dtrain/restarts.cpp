#include "restarts.h"

#include "train/checkpointing.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

namespace dtrain::cli {
namespace {

namespace fs = std::filesystem;

// The newest checkpoint --resume will try first (complete manifest, files
// of the recorded sizes); 0 = none.
int64_t newest_checkpoint(const std::string& dir) {
  std::vector<std::string> rejected;
  const auto steps = train::resumable_checkpoints(dir, rejected);
  return steps.empty() ? 0 : steps.front();
}

// The steps rank 0 recorded as done; nullopt when it recorded none.
std::optional<int64_t> steps_done(const fs::path& progress) {
  std::ifstream file(progress);
  long long done = -1;
  if (file >> done && done >= 0) return done;
  return std::nullopt;
}

// The first rank that failed, as its supervisor wrote it (mpirun); else what
// this launcher saw.
std::string who_failed(const fs::path& failures, const JobEnd& end) {
  std::ifstream file(failures);
  std::string first;
  if (std::getline(file, first) && !first.empty()) return first;
  return end.failure.empty() ? "the job exited with code " + std::to_string(end.code) : end.failure;
}

std::string checkpoint_name(const std::string& dir, int64_t step) {
  return step > 0 ? "the checkpoint of step " + std::to_string(step) + " (" + train::checkpoint_path(dir, step) + ")"
                  : "step 0 (no checkpoint yet)";
}

}  // namespace

int run_with_restarts(const RestartOptions& options, const std::function<JobEnd(const Environment&)>& attempt) {
  const std::string dir = fs::absolute(options.checkpoint_dir).string();
  fs::create_directories(dir);
  const fs::path progress = fs::path(dir) / ".dtrain-progress";
  const fs::path failures = fs::path(dir) / ".dtrain-failures";
  int restarts = 0;            // every restart, grows included (DTRAIN_RESTART_COUNT)
  int failures_restarted = 0;  // the restarts after a failure, which --max-restarts limits
  int64_t steps_lost = 0;
  std::optional<int64_t> previous_checkpoint;  // the newest checkpoint at the previous failure
  int without_progress = 0;                    // failures in a row that it did not advance
  for (;;) {
    std::error_code ignored;
    fs::remove(progress, ignored);
    fs::remove(failures, ignored);
    const JobEnd end = attempt({{"DTRAIN_RESTART_COUNT", std::to_string(restarts)},
                                {"DTRAIN_STEPS_LOST", std::to_string(steps_lost)},
                                {"DTRAIN_PROGRESS_FILE", progress.string()},
                                {"DTRAIN_FAILURE_FILE", failures.string()}});
    if (end.code == 0 || end.stopped || end.final) return end.code;
    std::string who = who_failed(failures, end);
    const std::optional<int64_t> reached = steps_done(progress);
    const std::string where = reached ? " after step " + std::to_string(*reached) : " before its first step";
    if (end.resized) {
      // Stopped by the launcher to grow (elastic.h). A grow only if the job
      // then saved the step it had reached; anything else (a rank that
      // failed meanwhile, a save that did not happen) is a failure and goes
      // the failure's way: counted, and subject to the no-progress rule.
      const int64_t checkpoint = newest_checkpoint(dir);
      if (reached && checkpoint >= *reached) {
        ++restarts;
        std::cerr << "dtrain launch: restart to grow (not counted against --max-restarts): the job stopped" << where
                  << " with " << checkpoint_name(dir, checkpoint) << "; continuing from it, 0 steps lost" << std::endl;
        continue;
      }
      who = "the job, asked to stop to grow, ended without a checkpoint of its last step (" + who + ")";
    }
    if (end.code == 2) {
      std::cerr << "dtrain launch: not restarting: " << who << where
                << ", a usage error (exit code 2) that a restart would repeat" << std::endl;
      return end.code;
    }
    const int64_t checkpoint = newest_checkpoint(dir);
    without_progress = previous_checkpoint && checkpoint <= *previous_checkpoint ? without_progress + 1 : 0;
    previous_checkpoint = checkpoint;
    if (without_progress >= 2) {
      std::cerr << "dtrain launch: giving up after " << failures_restarted
                << (failures_restarted == 1 ? " restart" : " restarts") << ": "
                << who << where << ", and the job has failed " << without_progress + 1
                << " times in a row without getting past " << checkpoint_name(dir, checkpoint)
                << ". A failure that recurs at the same step is not one a restart fixes (a rank's error above "
                << "says what: data, memory, a NaN); fix its cause, then "
                << (checkpoint > 0 ? "run the same command with --resume to continue from step " + std::to_string(checkpoint)
                                   : std::string("run the command again"))
                << "." << std::endl;
      return end.code;
    }
    if (failures_restarted >= options.max_restarts) {
      std::cerr << "dtrain launch: giving up: " << who << where << ", and the job has been restarted "
                << options.max_restarts << (options.max_restarts == 1 ? " time" : " times")
                << " already (--max-restarts " << options.max_restarts << "); the newest is "
                << checkpoint_name(dir, checkpoint)
                << (checkpoint > 0 ? ": run the same command with --resume to continue from it." : ".") << std::endl;
      return end.code;
    }
    const int64_t lost = reached ? std::max<int64_t>(0, *reached - checkpoint) : 0;
    ++restarts;
    ++failures_restarted;
    steps_lost += lost;
    std::ostringstream line;
    line << "dtrain launch: restart " << failures_restarted << " of " << options.max_restarts << ": " << who << where
         << "; restarting from " << checkpoint_name(dir, checkpoint) << ", " << lost
         << (lost == 1 ? " step" : " steps") << " lost (" << steps_lost << " in all)";
    std::cerr << line.str() << std::endl;
  }
}

}  // namespace dtrain::cli
