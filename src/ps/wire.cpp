#include "ps/wire.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

namespace dtrain::ps {

const char* to_string(MessageKind kind) {
  switch (kind) {
    case MessageKind::Push: return "push";
    case MessageKind::Done: return "done";
    case MessageKind::Params: return "params";
    case MessageKind::Final: return "final";
    case MessageKind::Checkpoint: return "checkpoint";
  }
  return "unknown";
}

torch::Tensor make_message(int64_t count) { return torch::zeros({kHeaderFloats + count}, torch::kFloat); }

void write_header(torch::Tensor& message, const MessageHeader& header) {
  std::memcpy(message.data_ptr<float>(), &header, sizeof(header));
}

MessageHeader read_header(const torch::Tensor& message) {
  MessageHeader header;
  std::memcpy(static_cast<void*>(&header), message.const_data_ptr<float>(), sizeof(header));
  return header;
}

void wait_within(Work& work, std::chrono::milliseconds timeout, const std::function<std::string()>& describe,
                 const std::string& hint) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Backoff backoff;
  while (!work.is_completed()) {
    if (std::chrono::steady_clock::now() > deadline) {
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%g", std::chrono::duration<double>(timeout).count());
      throw CommError(describe() + " within " + seconds + " s (DTRAIN_TIMEOUT)" + hint);
    }
    backoff.pause();
  }
  work.wait();
}

void Backoff::pause() {
  micros_ = std::clamp(micros_ * 2, 20, 1000);
  std::this_thread::sleep_for(std::chrono::microseconds(micros_));
}

}  // namespace dtrain::ps
