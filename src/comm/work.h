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

 private:
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::function<void()> waiter_help_;
  const char* trace_op_ = "operation";
  trace::LabelValue trace_label_;
};

}  // namespace dtrain
