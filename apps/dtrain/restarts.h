// Automatic restart (dtrain launch / dtrain train --max-restarts K): when an
// attempt of the job fails (a rank died, exited non-zero, or its watchdog
// fired), start it again, up to K times; every attempt after the first
// resumes from the newest complete checkpoint in the job's checkpoint folder.
//
// The attempts learn where they stand from the environment
// (src/train/restarts.h): DTRAIN_RESTART_COUNT, DTRAIN_STEPS_LOST, and
// DTRAIN_PROGRESS_FILE, where rank 0 records its steps; under mpirun each
// rank's supervisor appends how its rank failed to DTRAIN_FAILURE_FILE
// (mpirun's own message names no rank). Both files live in the checkpoint
// folder, which every host of a job must see anyway to resume.
//
// Not restarted: a stop the user asked for (SIGINT/SIGTERM), a usage error
// (exit code 2: the same flags fail the same way), and a job that makes no
// progress twice in a row (its newest checkpoint did not advance across three
// failures): restarting cannot get past a failure that recurs at one step.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::cli {

// How one attempt of a job ended.
struct JobEnd {
  int code = 0;          // the job's exit code (the first failing rank's)
  std::string failure;   // "rank 1 (pid 42) was killed by signal 9 (Killed)"; "" when none
  bool stopped = false;  // SIGINT/SIGTERM from the user: a requested stop
  bool final = false;    // the attempt could not start (too few hosts left): no restart helps
  bool resized = false;  // stopped by the launcher to restart on more ranks (elastic.h): not a failure
};

// Environment variables added to every rank of an attempt.
using Environment = std::vector<std::pair<std::string, std::string>>;

struct RestartOptions {
  int max_restarts = 0;
  std::string checkpoint_dir;
  // Elastic (apps/dtrain/elastic.h): a restart may run on as few as this
  // many ranks, on the hosts that remain; 0 = always the job's size.
  int min_ranks = 0;
};

// Runs `attempt` until it succeeds, is stopped, or may not be restarted
// (see above); logs each restart to stderr and returns the last attempt's
// exit code.
int run_with_restarts(const RestartOptions& options, const std::function<JobEnd(const Environment&)>& attempt);

}  // namespace dtrain::cli
