// Turns an operation stuck longer than the timeout into a fatal, named error.
// A blocked MPI or Gloo call cannot be cancelled, and a rank that silently
// waits forever is the worst failure a distributed job can have, so the
// watchdog reports what was stuck and then ends the whole job.
#pragma once

#include "comm/comm_thread.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace dtrain {

class Watchdog {
 public:
  // `on_timeout` receives the message naming the stuck operation; it is
  // expected not to return (it aborts the job).
  Watchdog(const CommThread& comm_thread, std::chrono::milliseconds timeout,
           std::function<void(const std::string& message)> on_timeout);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void loop();

  const CommThread& comm_thread_;
  const std::chrono::milliseconds timeout_;
  std::function<void(const std::string&)> on_timeout_;
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

// DTRAIN_TIMEOUT in seconds (fractions allowed), else 300 s.
std::chrono::milliseconds timeout_from_environment();

}  // namespace dtrain
