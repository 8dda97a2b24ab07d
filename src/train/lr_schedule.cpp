#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace dtrain::train {

double learning_rate(const LRSchedule& schedule, int64_t step) {
  const double peak = schedule.peak_lr;
  if (step < schedule.warmup_steps)
    return peak * static_cast<double>(step + 1) / static_cast<double>(schedule.warmup_steps);
  const int64_t decay_steps = schedule.total_steps - 1 - schedule.warmup_steps;
  if (decay_steps <= 0) return peak;
  const double progress = std::min(1.0, static_cast<double>(step - schedule.warmup_steps) / decay_steps);
  const double lowest = peak * schedule.final_fraction;
  return lowest + (peak - lowest) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace dtrain::train
