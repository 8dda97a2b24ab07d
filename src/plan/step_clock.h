// A step's time on one rank, replayed with its memory (Note [step time],
// src/plan/step_time.cpp): a compute stream and one link that runs the
// engine's collectives in the order they are issued. With `explain` it also
// records the spans (StepTime::spans); the names are made only then.
#pragma once

#include "plan/plan_internal.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::plan::detail {

class StepClock {
 public:
  explicit StepClock(const Layout& layout)
      : share_(layout.compute.communication_share), recording_(layout.explain) {}

  // Work on the compute stream; `name()` names its span.
  template <typename Name>
  void compute(double seconds, Name&& name) {
    if (recording_ && seconds > 0) record(name(), "compute", false, now_, seconds, 0);
    now_ += seconds;
    time_.compute_seconds += seconds;
  }
  // A collective of `bytes` issued now; returns when it completes. The link
  // takes one at a time, in issue order (the Communicator's one thread per
  // rank). A share of it holds the compute stream (ComputeRates::
  // communication_share).
  template <typename Name>
  double issue(double seconds, Name&& name, int64_t bytes = 0) {
    const double start = std::max(link_free_, now_);
    link_free_ = start + seconds;
    time_.communication_seconds += seconds;
    if (recording_ && seconds > 0) record(name(), "comm", true, start, seconds, bytes);
    const double held = share_ * seconds;
    if (recording_ && held > 0) record("cores driving " + name(), "wait", false, now_, held, 0);
    now_ += held;
    time_.exposed_communication_seconds += held;
    return link_free_;
  }
  // The compute stream waits for a collective that completes at `done`.
  void wait(double done) {
    if (done <= now_) return;
    if (recording_) record("wait", "wait", false, now_, done - now_, 0);
    time_.exposed_communication_seconds += done - now_;
    now_ = done;
  }
  // Everything issued so far.
  void wait_all() { wait(link_free_); }
  // A collective the compute stream runs in line (the model's own).
  template <typename Name>
  void in_line(double seconds, Name&& name) {
    wait_all();
    if (recording_ && seconds > 0) {
      record(name(), "comm", true, now_, seconds, 0);
      record(name(), "wait", false, now_, seconds, 0);
    }
    now_ += seconds;
    link_free_ = now_;
    time_.communication_seconds += seconds;
    time_.exposed_communication_seconds += seconds;
  }
  StepTime finish() {
    wait_all();
    time_.seconds = now_;
    if (recording_) record("step", "step", false, 0, now_, 0);
    return std::move(time_);
  }

 private:
  void record(std::string name, const char* category, bool link, double start, double seconds, int64_t bytes) {
    time_.spans.push_back({std::move(name), category, link, start, seconds, bytes});
  }
  double now_ = 0, link_free_ = 0, share_ = 0;
  bool recording_ = false;
  StepTime time_;
};

// The seconds of each part of a step at the layout's rates.
struct StepCosts {
  StepCosts(const ModelSpec& model, const Layout& layout, const FSDPOptions& fsdp);
  bool predicted = false;            // rates and links known
  std::vector<double> forward;       // per unit (the root's: before its children, the embeddings)
  double tail = 0;                   // the root's after its children: the head, the logits and the loss
  std::vector<double> gather;        // one all-gather of the unit (0: none on the wire)
  std::vector<int64_t> gather_bytes; // what this rank sends of it
  std::vector<double> reduce;        // its gradients' reductions, issued together
  std::vector<int64_t> reduce_bytes;
  // Compressed collectives' casts on the compute stream (records made and
  // read back; fsdp_compression.h): per all-gather, and per reduction.
  std::vector<double> gather_casts, reduce_casts;
  double optimizer = 0;              // the optimizer step over this rank's elements
  double model_collectives = 0;      // the model's own (ModelSpec::collectives), on model_link
  double backward(size_t u) const { return 2 * forward[u]; }
  // DDP: one bucket of `bytes` all-reduced over the world.
  double bucket(int64_t bytes) const;

 private:
  const Layout& layout_;
};

}  // namespace dtrain::plan::detail
