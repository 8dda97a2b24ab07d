// Chooses, from a run's first steps, whether FSDP prefetches.
//
// Note [prefetch tuning]
// Prefetching the next unit's all-gather pays when communication can run
// while the current unit computes: an idle core, a NIC, a GPU copy engine.
// Where ranks x threads already fill the cores and the transport is memory
// copies (two local ranks on two cores), the early gather competes with
// compute and can make the step slower (docs/PERFORMANCE.md, issue 4). Which
// case a run is in depends on the machine, the model and the backend, so
// instead of a fixed default the run measures: after kWarmupSteps untimed
// training forwards, forwards alternate with and without prefetch,
// `trial_steps` of each; a step's time is the interval from its root forward
// to the next one (so it includes backward, reductions and the optimizer).
// Then one all-reduce (max) of the two medians over the world makes every
// rank keep the same choice: prefetch on or off changes the order in which a
// rank issues all-gathers, which must match across ranks. Prefetch changes no
// arithmetic, so the trial steps train exactly as the others.
#pragma once

#include <dtrain/comm.h>
#include <dtrain/fsdp.h>

#include <chrono>
#include <vector>

namespace dtrain::detail {

class PrefetchTuner {
 public:
  static constexpr int kWarmupSteps = 2;

  // trial_steps == 0: no tuning, always prefetch (as configured).
  explicit PrefetchTuner(int trial_steps) : trial_steps_(trial_steps) {}

  // At the start of a root forward that trains (grad mode on); returns
  // whether this step prefetches. Collective over `world` at the step that
  // decides (every rank reaches it at the same forward).
  bool begin_training_forward(Communicator& world);
  // Whether a forward that does not train (evaluation) prefetches: the
  // current choice, identical on every rank.
  bool current() const { return current_; }
  const FSDPPrefetchTuning& result() const { return result_; }

 private:
  void decide(Communicator& world);

  int trial_steps_;
  int64_t forwards_ = 0;
  bool current_ = true;
  bool timing_ = false;  // the step that began at last_start_ is a trial step
  std::chrono::steady_clock::time_point last_start_;
  std::vector<double> with_s_, without_s_;
  FSDPPrefetchTuning result_;
};

}  // namespace dtrain::detail
