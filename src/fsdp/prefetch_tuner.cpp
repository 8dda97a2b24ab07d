#include "fsdp/prefetch_tuner.h"

#include <dtrain/trace.h>

#include <algorithm>

namespace dtrain::detail {
namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

bool PrefetchTuner::begin_training_forward(Communicator& world) {
  if (trial_steps_ == 0 || result_.decided) return current_;
  const auto now = std::chrono::steady_clock::now();
  if (timing_) (current_ ? with_s_ : without_s_).push_back(std::chrono::duration<double>(now - last_start_).count());
  const int64_t forward = forwards_++;
  last_start_ = now;
  if (forward < kWarmupSteps) {
    timing_ = false;
    current_ = true;
    return current_;
  }
  if (static_cast<int>(without_s_.size()) >= trial_steps_ && static_cast<int>(with_s_.size()) >= trial_steps_) {
    decide(world);
    timing_ = false;
    return current_;
  }
  timing_ = true;
  current_ = (forward - kWarmupSteps) % 2 == 0;
  return current_;
}

void PrefetchTuner::decide(Communicator& world) {
  // The slowest rank's medians: a step ends when its slowest rank does.
  auto medians = torch::tensor({median(with_s_), median(without_s_)}, torch::kFloat64);
  if (world.size() > 1) world.blocking().all_reduce(medians, ReduceOp::Max);
  result_.decided = true;
  result_.with_prefetch_s = medians[0].item<double>();
  result_.without_prefetch_s = medians[1].item<double>();
  result_.trial_steps = trial_steps_;
  // Ties keep prefetch: where nothing is lost it may still hide latency
  // that the trial steps did not show.
  result_.prefetch = result_.with_prefetch_s <= result_.without_prefetch_s;
  current_ = result_.prefetch;
  trace::instant("prefetch_tuned", "fsdp",
                 {{"prefetch", static_cast<int64_t>(result_.prefetch)},
                  {"with_us", static_cast<int64_t>(result_.with_prefetch_s * 1e6)},
                  {"without_us", static_cast<int64_t>(result_.without_prefetch_s * 1e6)}});
}

}  // namespace dtrain::detail
