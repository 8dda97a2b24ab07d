#include "comm/work.h"

namespace dtrain {

void WorkState::wait() {
  trace::Span span("wait", trace::category::wait, {{"op", trace_op_}});
  trace::add_label(span, trace_label_);
  if (waiter_help_ && !is_completed()) waiter_help_();
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [this] { return done_; });
  if (error_) std::rethrow_exception(error_);
}

bool WorkState::is_completed() const {
  std::lock_guard lock(mutex_);
  return done_;
}

void WorkState::mark_done() {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  done_cv_.notify_all();
}

void WorkState::mark_failed(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    error_ = std::move(error);
    done_ = true;
  }
  done_cv_.notify_all();
}

}  // namespace dtrain
