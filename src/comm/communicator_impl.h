// What a Communicator owns: its backend, the thread its operations run on and
// the watchdog over that thread. Internal.
#pragma once

#include "comm/backend.h"
#include "comm/comm_thread.h"
#include "comm/watchdog.h"

#include <chrono>
#include <memory>

namespace dtrain {

struct Communicator::Impl {
  Impl(std::unique_ptr<Backend> backend, std::chrono::milliseconds timeout, bool debug);

  std::unique_ptr<Backend> backend;
  std::chrono::milliseconds timeout;
  bool debug;
  // Collectives executed so far (debug mode compares it across ranks).
  uint64_t collectives_run = 0;
  // Declared after `backend` so that both are destroyed before it: the
  // thread drains its queue (which still uses the backend) when destroyed.
  std::unique_ptr<CommThread> thread;
  std::unique_ptr<Watchdog> watchdog;
};

CommPtr make_communicator(std::unique_ptr<Backend> backend, std::chrono::milliseconds timeout, bool debug);

}  // namespace dtrain
