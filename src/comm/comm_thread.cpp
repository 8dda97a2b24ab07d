#include "comm/comm_thread.h"

#ifdef __linux__
#include <sys/prctl.h>
#endif

namespace dtrain {

CommThread::CommThread() : thread_([this] { loop(); }) {}

void CommThread::shutdown() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_available_.notify_all();
  if (thread_.joinable()) thread_.join();
}

CommThread::~CommThread() { shutdown(); }

namespace {

// A new operation's Work, carrying what wait() records in a trace.
std::shared_ptr<WorkState> new_work(const OperationTrace& traced, trace::LabelValue& label) {
  auto work = std::make_shared<WorkState>();
  label = trace::enabled() ? trace::current_label() : trace::LabelValue{};
  work->set_trace(traced.op, label);
  return work;
}

// Counts this thread among CommThread::waiters() for as long as it lives.
class Waiting {
 public:
  explicit Waiting(std::atomic<int>& waiters) : waiters_(waiters) { waiters_.fetch_add(1, std::memory_order_relaxed); }
  ~Waiting() { waiters_.fetch_sub(1, std::memory_order_relaxed); }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  std::atomic<int>& waiters_;
};

}  // namespace

WorkPtr CommThread::enqueue(Describe describe, Operation op, OperationTrace traced) {
  trace::LabelValue label;
  auto work = new_work(traced, label);
  {
    std::lock_guard lock(mutex_);
    const uint64_t seq = next_seq_++;
    work->set_waiter_help([this, seq] { run_through(seq); });
    queue_.push_back(Task{seq, std::move(describe), std::move(op), work, traced, label});
  }
  work_available_.notify_one();
  return work;
}

WorkPtr CommThread::run_or_enqueue(Describe describe, Operation op, OperationTrace traced) {
  std::unique_lock lock(mutex_);
  if (!queue_.empty() || executing_ || stopping_) {
    lock.unlock();
    return enqueue(std::move(describe), std::move(op), traced);
  }
  trace::LabelValue label;
  auto work = new_work(traced, label);
  const uint64_t seq = next_seq_++;
  executing_ = true;
  // This thread waits for the operation as surely as one in Work::wait():
  // the backend must not pace its test loop (Note [waiting without spinning]).
  Waiting waiting(waiters_);
  execute(Task{seq, std::move(describe), std::move(op), work, traced, label}, lock);
  return work;
}

CommThread::Running CommThread::running() const {
  std::lock_guard lock(mutex_);
  return running_;
}

void CommThread::loop() {
  trace::set_thread_name("comm");
#ifdef __linux__
  // Short sleeps between tests of an operation (completion_wait.h) should
  // last about as long as asked, not the default 50 us of timer slack more.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
  std::unique_lock lock(mutex_);
  for (;;) {
    work_available_.wait(lock, [this] { return !executing_ && (stopping_ || !queue_.empty()); });
    if (queue_.empty()) return;  // stopping, and everything queued has run
    run_front(lock);
  }
}

void CommThread::run_through(uint64_t seq) {
  Waiting waiting(waiters_);
  std::unique_lock lock(mutex_);
  while (finished_ <= seq) {
    if (!executing_ && !queue_.empty()) run_front(lock);
    else progress_.wait(lock);
  }
}

void CommThread::run_front(std::unique_lock<std::mutex>& lock) {
  Task task = std::move(queue_.front());
  queue_.pop_front();
  executing_ = true;
  execute(std::move(task), lock);
}

void CommThread::execute(Task task, std::unique_lock<std::mutex>& lock) {
  running_ = Running{true, task.seq, task.describe, std::chrono::steady_clock::now()};
  const std::string earlier_failure = first_failure_;
  lock.unlock();

  std::string failure;
  if (!earlier_failure.empty()) {
    task.work->mark_failed(std::make_exception_ptr(
        CommError(task.describe(task.seq) +
                  " was not run: the communicator is unusable after an earlier failure: " + earlier_failure)));
  } else {
    trace::Span span(task.trace.op, trace::category::comm, {{"bytes", task.trace.bytes}, {"seq", task.seq}});
    trace::add_label(span, task.label);
    try {
      task.op(task.seq);
    } catch (const std::exception& error) {
      failure = task.describe(task.seq) + ": " + error.what();
    } catch (...) {
      failure = task.describe(task.seq) + ": unknown error";
    }
  }
  // The operation's captured tensors (FSDP's full-size gradient buffers,
  // say) are released before the work is marked done, so a waiter that
  // returns from wait() finds their memory already freed.
  task.op = nullptr;

  lock.lock();
  executing_ = false;
  running_.active = false;
  ++finished_;
  if (!failure.empty() && first_failure_.empty()) first_failure_ = failure;
  // Mark the work only now, so that a waiter that wakes up finds the queue
  // state (and first_failure_) already updated.
  if (earlier_failure.empty()) {
    if (failure.empty()) task.work->mark_done();
    else task.work->mark_failed(std::make_exception_ptr(CommError(failure)));
  }
  if (!queue_.empty() || stopping_) work_available_.notify_one();
  progress_.notify_all();
}

}  // namespace dtrain
