// One background thread per communicator that runs its operations in issue
// order. Issue order is the same on every rank (every rank's program issues the
// same collectives in the same order), so running them one at a time in that
// order is what keeps ranks matched; the compute thread only enqueues.
#pragma once

#include "comm/work.h"

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace dtrain {

class CommThread {
 public:
  // The operation receives its sequence number (0, 1, 2, ... per communicator).
  using Operation = std::function<void(uint64_t seq)>;

  CommThread();
  // Runs what is still queued, then joins.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // `describe` turns the sequence number into a human-readable label used in
  // errors ("all_reduce #12 (count=1000, dtype=float32)").
  WorkPtr enqueue(std::function<std::string(uint64_t seq)> describe, Operation op);

  struct Running {
    bool active = false;
    uint64_t seq = 0;
    std::string description;
    std::chrono::steady_clock::time_point since;
  };
  // What runs right now; the watchdog polls this.
  Running running() const;

 private:
  struct Task {
    uint64_t seq;
    std::string description;
    Operation op;
    std::shared_ptr<WorkState> work;
  };
  void loop();

  mutable std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  uint64_t next_seq_ = 0;
  Running running_;
  // After the first failure every later operation fails at once with this
  // message: a half-completed collective leaves ranks out of step, and going
  // on would turn one clear error into a hang.
  std::string first_failure_;
  std::thread thread_;
};

}  // namespace dtrain
