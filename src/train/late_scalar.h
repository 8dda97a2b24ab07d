// A scalar computed on the device, read on the host later without waiting for
// the work queued after it. Note [the loss one step late]:
// reading a CUDA tensor's value (item()) waits for everything queued on the
// stream before the read, so a trainer that reads each step's loss right after
// its backward leaves the GPU idle while the host queues the optimizer's many
// small kernels (7% of a 0.3B GPT's step on an H200, 2026-12-04; plain LibTorch
// reads nothing until the step's end). The trainer instead starts the loss's
// copy to pinned host memory as soon as backward is queued, with an event
// behind it, and reads it in the next step, once that step's work is queued:
// the wait is for the copy alone, which the GPU finished long before. The step
// loop records a step when its loss arrives, one step late, and settles the
// last one before anything that must see it (a checkpoint, an evaluation, a
// stop, the end), so the records, the non-finite rule and the metrics are
// those of reading at once, a step later.
#pragma once

#include <torch/types.h>

#include <memory>

namespace c10 {
class Event;
}

namespace dtrain::train {

class LateScalar {
 public:
  LateScalar();
  ~LateScalar();
  LateScalar(LateScalar&&) noexcept;
  LateScalar& operator=(LateScalar&&) noexcept;

  // Starts copying `value` (one element, on any device) to the host.
  explicit LateScalar(const torch::Tensor& value);
  bool pending() const { return host_.defined(); }
  // The value (pending() must hold): waits for the copy only, then forgets it.
  double take();

 private:
  torch::Tensor host_;
  std::unique_ptr<c10::Event> copied_;  // on a GPU: recorded after the copy
};

}  // namespace dtrain::train
