#include "comm/watchdog.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <string>

namespace dtrain {

Watchdog::Watchdog(const CommThread& comm_thread, std::chrono::milliseconds timeout,
                   std::function<void(const std::string&)> on_timeout)
    : comm_thread_(comm_thread), timeout_(timeout), on_timeout_(std::move(on_timeout)),
      thread_([this] { loop(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
}

void Watchdog::loop() {
  using namespace std::chrono;
  // Poll often enough that the error comes within ~10% of the timeout.
  const auto poll = std::clamp<milliseconds>(timeout_ / 10, milliseconds(10), milliseconds(1000));
  std::unique_lock lock(mutex_);
  while (!stop_cv_.wait_for(lock, poll, [this] { return stopping_; })) {
    const auto running = comm_thread_.running();
    if (!running.active) continue;
    const auto stuck_for = duration_cast<milliseconds>(steady_clock::now() - running.since);
    if (stuck_for < timeout_) continue;
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%g", duration<double>(timeout_).count());
    on_timeout_(running.description() + " did not complete within " + seconds + " s (DTRAIN_TIMEOUT)");
    return;
  }
}

std::chrono::milliseconds timeout_from_environment() {
  const char* value = std::getenv("DTRAIN_TIMEOUT");
  if (value == nullptr || *value == '\0') return std::chrono::seconds(300);
  char* end = nullptr;
  const double seconds = std::strtod(value, &end);
  if (end == value || *end != '\0' || !std::isfinite(seconds) || seconds < 0.001 || seconds > 1e7)
    throw CommError(std::string("DTRAIN_TIMEOUT='") + value +
                    "' must be a number of seconds from 0.001 to 10000000 (example: DTRAIN_TIMEOUT=60)");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

}  // namespace dtrain
