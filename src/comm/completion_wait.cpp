#include "comm/completion_wait.h"

#include "comm/env.h"
#include "dtrain/comm.h"

#include <sched.h>

#include <algorithm>
#include <thread>

namespace dtrain {

WaitSettings WaitSettings::from_environment(bool all_local) {
  WaitSettings settings;
  settings.mode = all_local ? Mode::Handshake : Mode::Backoff;
  if (const auto mode = env_string("DTRAIN_COMM_WAIT")) {
    if (*mode == "spin") settings.mode = Mode::Spin;
    else if (*mode == "backoff") settings.mode = Mode::Backoff;
    else if (*mode == "handshake") settings.mode = Mode::Handshake;
    else throw CommError("DTRAIN_COMM_WAIT='" + *mode + "' must be spin, backoff or handshake");
  }
  if (const auto us = env_int("DTRAIN_COMM_MAX_SLEEP_US", 0, 100000)) settings.max_sleep = std::chrono::microseconds(*us);
  if (const auto bytes = env_int("DTRAIN_COMM_NONBLOCKING_MIN_BYTES", 0, 1 << 30)) settings.nonblocking_min_bytes = *bytes;
  return settings;
}

CompletionWait::CompletionWait(const WaitSettings& settings, const std::atomic<int>* waiters)
    : settings_(settings), waiters_(waiters), start_(std::chrono::steady_clock::now()) {}

void CompletionWait::pause() {
  if (waiters_ && waiters_->load(std::memory_order_relaxed) > 0) return;  // on the critical path: keep testing
  const auto elapsed = std::chrono::steady_clock::now() - start_;
  if (elapsed < settings_.spin_for) return;
  if (elapsed < settings_.yield_for || settings_.max_sleep.count() == 0) {
    sched_yield();
    return;
  }
  std::this_thread::sleep_for(sleep_);
  sleep_ = std::min(sleep_ * 2, settings_.max_sleep);
}

}  // namespace dtrain
