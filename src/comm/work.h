// The shared state behind a Work handle: set once by the communicator's
// thread, read by any number of waiters.
#pragma once

#include "dtrain/comm.h"

#include <condition_variable>
#include <exception>
#include <mutex>

namespace dtrain {

class WorkState final : public Work {
 public:
  void wait() override;
  bool is_completed() const override;

  void mark_done();
  void mark_failed(std::exception_ptr error);

 private:
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace dtrain
