// What goes over a worker-server pair (Note [one communicator per
// worker-server pair] in include/dtrain/ps.h), and the bounded wait every
// parameter-server wait goes through. Internal.
//
// Note [parameter-server messages]
// Every message is one float32 tensor: a fixed header (kHeaderFloats floats
// holding a MessageHeader's bytes) followed by one server's piece of the flat
// parameters or gradients. All messages on a pair have the same size, so each
// side can keep one receive buffer per peer. A pair carries, in order:
//   worker -> server  Push (clock, the version its parameters had, lr, gradient)
//   server -> worker  Params (the server's version and its current piece)
//   ... repeated ...
//   worker -> server  Checkpoint (version: the step; payload unused; no
//                     reply: the server saves once every running worker has
//                     sent one, collectively with them, and the pair goes on
//                     with the worker's next push)
//   ... repeated ...
//   worker -> server  Done (payload unused)
//   server -> worker  Final (sent once every worker is done)
#pragma once

#include "dtrain/comm.h"

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace dtrain::ps {

enum class MessageKind : int32_t { Push = 1, Done = 2, Params = 3, Final = 4, Checkpoint = 5 };
const char* to_string(MessageKind kind);

struct MessageHeader {
  MessageKind kind = MessageKind::Push;
  int32_t worker = 0;
  int64_t clock = 0;    // Push: the worker's pushes before this one
  int64_t version = 0;  // Push: version of the parameters used; Params/Final: the server's version
  double lr = 0;        // Push: learning rate for this update
  // Push: the worker's loss was not finite (kNonfiniteLoss), or it skipped
  // this push itself (kSkipped; async and ssp). Params: the server left the
  // step out (kSkipped; sync, Options::skip_nonfinite).
  int32_t flags = 0;
  int32_t unused = 0;
  double grad_norm = 0;  // Params (sync, with clipping or skipping): the applied step's norm before clipping
};
constexpr int32_t kNonfiniteLoss = 1;
constexpr int32_t kSkipped = 2;

constexpr int64_t kHeaderFloats = sizeof(MessageHeader) / sizeof(float);
static_assert(sizeof(MessageHeader) % sizeof(float) == 0, "the header must fill whole float32 slots");

// A message buffer for a piece of `count` elements.
torch::Tensor make_message(int64_t count);
void write_header(torch::Tensor& message, const MessageHeader& header);
MessageHeader read_header(const torch::Tensor& message);
inline torch::Tensor payload(const torch::Tensor& message) {
  return message.narrow(0, kHeaderFloats, message.numel() - kHeaderFloats);
}

// How long a parameter-server wait lasts: a little less than the
// communicator's timeout, so that the CommError naming the peer comes before
// the watchdog (which knows only the pair communicator's ranks) ends the job.
inline std::chrono::milliseconds wait_limit(const Communicator& comm) { return comm.timeout() * 19 / 20; }

// Waits for `work` for at most `timeout`, then throws CommError with
// describe() (which names the peer) + " within T s (DTRAIN_TIMEOUT)" +
// the hint, if any. Rethrows the work's own error.
void wait_within(Work& work, std::chrono::milliseconds timeout, const std::function<std::string()>& describe,
                 const std::string& hint = "");

// Sleeps a little longer each call (for polling loops), up to 1 ms.
class Backoff {
 public:
  void pause();
  void reset() { micros_ = 0; }

 private:
  int micros_ = 0;
};

}  // namespace dtrain::ps
