// SIGINT / SIGTERM while training with --checkpoint-dir: instead of dying
// mid-step, the run saves a checkpoint at the next step boundary and stops
// (a second signal stops at once, as usual). Ranks may get the signal at
// different moments, so the trainer agrees on it in its per-step all-reduce.
// SIGUSR1 does the same: it is how an elastic launcher stops a job to
// restart it on more ranks (apps/dtrain/elastic.h), since mpirun passes
// SIGUSR1 on to the ranks as it is, where it follows a SIGTERM with a
// SIGKILL one second later, before a large checkpoint is written.
#pragma once

namespace dtrain::train {

class StopSignals {
 public:
  // Installs the handlers; the destructor restores the previous ones.
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received since construction (SIGINT, SIGTERM, SIGUSR1), or 0.
  static int received();
};

// "SIGINT", "SIGTERM", "SIGUSR1", or "signal N".
const char* signal_name(int signal_number);

}  // namespace dtrain::train
