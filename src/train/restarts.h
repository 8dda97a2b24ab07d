// What a training run learns from, and tells, the launcher that restarts it
// (dtrain launch / dtrain train --max-restarts; apps/dtrain/restarts.h).
//
// The launcher sets, for every attempt of a job it restarts:
//   DTRAIN_RESTART_COUNT  restarts so far (0 on the first attempt), as
//                         torchrun's TORCHELASTIC_RESTART_COUNT; an elastic
//                         job's restarts to grow count too;
//   DTRAIN_STEPS_LOST     steps done before a failure and not in the
//                         checkpoint the job restarted from, summed;
//   DTRAIN_PROGRESS_FILE  where rank 0 records the steps done after each
//                         step, so that the launcher can say where a failed
//                         attempt stopped and how many steps it lost.
// Both counts go to the final metrics line and the trace.
//
// DTRAIN_TEST_KILL_AT_STEP=STEP:RANK[:ATTEMPT][,...] (testing only): rank
// RANK kills itself with SIGKILL once step STEP is done (after its checkpoint,
// if one is due), on attempt ATTEMPT only (= DTRAIN_RESTART_COUNT), or on
// every attempt when ATTEMPT is left out (the attempt as
// restart_count_from_environment() counts it). The restart tests use it to kill
// ranks at chosen steps without racing a fast run from outside.
// DTRAIN_TEST_HANG_AT_STEP (same form, testing only): the rank stops itself
// with SIGSTOP instead, a rank that hangs: its peers' watchdogs fire after
// DTRAIN_TIMEOUT, and the restart test checks that this, too, restarts the job.
#pragma once

#include <cstdint>

namespace dtrain::train {

struct RestartState {
  int64_t restarts = 0;
  int64_t steps_lost = 0;
};

// Restarts so far: DTRAIN_RESTART_COUNT (dtrain's launcher), else
// TORCHELASTIC_RESTART_COUNT (torchrun --max-restarts, which restarts every
// worker of the job the same way); 0 when neither is set.
int64_t restart_count_from_environment();

// The restart count above and DTRAIN_STEPS_LOST (0 when unset: torchrun does
// not know how many steps a failure lost).
RestartState restart_state_from_environment();

// After step `done`: rank 0 records it in DTRAIN_PROGRESS_FILE, and a rank
// that DTRAIN_TEST_KILL_AT_STEP (or _HANG_AT_STEP) names for this step kills
// (or stops) itself. Nothing when none is set.
void after_step(int64_t done);

}  // namespace dtrain::train
