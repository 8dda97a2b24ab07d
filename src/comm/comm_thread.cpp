#include "comm/comm_thread.h"

namespace dtrain {

CommThread::CommThread() : thread_([this] { loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  thread_.join();
}

WorkPtr CommThread::enqueue(std::function<std::string(uint64_t)> describe, Operation op) {
  auto work = std::make_shared<WorkState>();
  {
    std::lock_guard lock(mutex_);
    const uint64_t seq = next_seq_++;
    queue_.push_back(Task{seq, describe(seq), std::move(op), work});
  }
  queue_cv_.notify_one();
  return work;
}

CommThread::Running CommThread::running() const {
  std::lock_guard lock(mutex_);
  return running_;
}

void CommThread::loop() {
  for (;;) {
    Task task;
    std::string earlier_failure;
    {
      std::unique_lock lock(mutex_);
      queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      earlier_failure = first_failure_;
      running_ = Running{true, task.seq, task.description, std::chrono::steady_clock::now()};
    }
    std::string failure;
    if (!earlier_failure.empty()) {
      failure = task.description + " was not run: the communicator is unusable after an earlier failure: " +
                earlier_failure;
      task.work->mark_failed(std::make_exception_ptr(CommError(failure)));
      failure.clear();  // keep the original first failure
    } else {
      try {
        task.op(task.seq);
        task.work->mark_done();
      } catch (const std::exception& error) {
        failure = task.description + ": " + error.what();
        task.work->mark_failed(std::make_exception_ptr(CommError(failure)));
      } catch (...) {
        failure = task.description + ": unknown error";
        task.work->mark_failed(std::make_exception_ptr(CommError(failure)));
      }
    }
    std::lock_guard lock(mutex_);
    running_.active = false;
    if (!failure.empty() && first_failure_.empty()) first_failure_ = failure;
  }
}

}  // namespace dtrain
