// The learning rate of each step: linear warmup, then cosine decay to 10%.
#pragma once

#include <cstdint>

namespace dtrain::train {

struct LRSchedule {
  double peak_lr = 0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double final_fraction = 0.1;  // the last step's rate is peak_lr * final_fraction
};

// Steps count from 0. During warmup (step < warmup_steps) the rate rises
// linearly: peak_lr * (step + 1) / warmup_steps, reaching peak_lr at the last
// warmup step. Then it follows half a cosine from peak_lr down to
// peak_lr * final_fraction at the last step (total_steps - 1):
//   lr = min + (peak - min) * (1 + cos(pi * p)) / 2,  p = (step - warmup) / (total - 1 - warmup).
// With no step after warmup the rate stays at peak_lr.
double learning_rate(const LRSchedule& schedule, int64_t step);

}  // namespace dtrain::train
