// SIGINT / SIGTERM while training with --checkpoint-dir: instead of dying
// mid-step, the run saves a checkpoint at the next step boundary and stops
// (a second signal stops at once, as usual). Ranks may get the signal at
// different moments, so the trainer agrees on it in its per-step all-reduce.
#pragma once

namespace dtrain::train {

class StopSignals {
 public:
  // Installs the handlers; the destructor restores the previous ones.
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received since construction (SIGINT, SIGTERM), or 0.
  static int received();
};

// "SIGINT", "SIGTERM", or "signal N".
const char* signal_name(int signal_number);

}  // namespace dtrain::train
