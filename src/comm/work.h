// The shared state behind a Work handle: set once by whichever thread runs the
// operation, read by any number of waiters.
#pragma once

#include "dtrain/comm.h"
#include "dtrain/trace.h"

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>

namespace dtrain {

class WorkState final : public Work {
 public:
  void wait() override;
  bool is_completed() const override;

  // Called by wait() before blocking: runs the queue up to this operation on
  // the waiting thread (see Note [issue order] in comm_thread.h).
  void set_waiter_help(std::function<void()> help) { waiter_help_ = std::move(help); }
  // What wait() records in a trace: the operation's name and its issuer's label.
  void set_trace(const char* op, const trace::LabelValue& label) {
    trace_op_ = op;
    trace_label_ = label;
  }

  void mark_done();
  void mark_failed(std::exception_ptr error);

  // Set by the issuer before the handle is returned; recorded by the thread
  // that runs the operation, before mark_done().
  void set_completion_event(std::shared_ptr<const c10::Event> event) { completion_event_ = std::move(event); }
  std::shared_ptr<const c10::Event> completion_event() const override { return completion_event_; }

 private:
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::function<void()> waiter_help_;
  std::shared_ptr<const c10::Event> completion_event_;
  const char* trace_op_ = "operation";
  trace::LabelValue trace_label_;
};

}  // namespace dtrain
