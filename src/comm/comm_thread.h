// Runs a communicator's operations one at a time, in issue order.
//
// Note [issue order]: every rank's program issues the same collectives in the
// same order, so running them strictly one after another in that order is
// what keeps ranks matched. Two kinds of thread may run the next operation:
// the communicator's background thread (so work overlaps with compute), and a
// thread blocked in Work::wait() on a queued operation, which runs the queue
// up to its own operation instead of sleeping through two thread hand-offs.
// Either way only one operation runs at a time and the queue is taken from
// the front, so the order is the same.
#pragma once

#include "comm/work.h"
#include "dtrain/trace.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace dtrain {

// What the trace records of an operation (Note [trace names] in dtrain/trace.h).
struct OperationTrace {
  const char* op = "operation";
  int64_t bytes = 0;
};

class CommThread {
 public:
  // The operation receives its sequence number (0, 1, 2, ... per communicator).
  using Operation = std::function<void(uint64_t seq)>;
  // Turns the sequence number into a label for errors ("all_reduce #12
  // (count=1000, dtype=float)"); called only when a label is needed, keeping
  // string formatting off the hot path.
  using Describe = std::function<std::string(uint64_t seq)>;

  CommThread();
  // Runs what is still queued, then joins the thread. Idempotent.
  void shutdown();
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  WorkPtr enqueue(Describe describe, Operation op, OperationTrace traced = {});
  // For a caller that waits for the operation at once (Note [caller waits]):
  // when nothing is queued or running, runs it here, on the calling thread,
  // and returns its finished Work; otherwise queues it as enqueue() does.
  WorkPtr run_or_enqueue(Describe describe, Operation op, OperationTrace traced = {});

  struct Running {
    bool active = false;
    uint64_t seq = 0;
    Describe describe;
    std::chrono::steady_clock::time_point since;
    std::string description() const { return describe ? describe(seq) : "?"; }
  };
  // What runs right now; the watchdog polls this.
  Running running() const;

  // How many threads are blocked in Work::wait() on this communicator's
  // operations right now: an operation that someone waits for is on the
  // critical path, and its backend waits for it without pausing (Note
  // [waiting without spinning] in completion_wait.h).
  const std::atomic<int>* waiters() const { return &waiters_; }

 private:
  struct Task {
    uint64_t seq;
    Describe describe;
    Operation op;
    std::shared_ptr<WorkState> work;
    OperationTrace trace;
    trace::LabelValue label;  // the issuer's, when tracing
  };
  void loop();
  // Runs queued operations until operation `seq` has finished (see Note [issue order]).
  void run_through(uint64_t seq);
  // Pops and runs the front task; `lock` is held on entry and on return.
  void run_front(std::unique_lock<std::mutex>& lock);
  // Runs `task`, which the caller has marked as executing; `lock` is held
  // on entry and on return, released while the operation runs.
  void execute(Task task, std::unique_lock<std::mutex>& lock);

  mutable std::mutex mutex_;
  // Two conditions, so that finishing an operation does not wake the idle
  // background thread (a context switch that steals a core from the peer
  // ranks' busy-polling) unless there is queued work for it.
  std::condition_variable work_available_;  // the background thread waits here
  std::condition_variable progress_;        // threads in Work::wait() wait here
  std::deque<Task> queue_;
  bool stopping_ = false;
  bool executing_ = false;
  uint64_t next_seq_ = 0;
  uint64_t finished_ = 0;  // operations 0 .. finished_-1 have finished
  std::atomic<int> waiters_{0};
  Running running_;
  // After the first failure every later operation fails at once with this
  // message: a half-completed collective leaves ranks out of step, and going
  // on would turn one clear error into a hang.
  std::string first_failure_;
  std::thread thread_;
};

}  // namespace dtrain
