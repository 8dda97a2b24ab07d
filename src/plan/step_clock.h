// A step's time on one rank, replayed with its memory (Note [step time],
// src/plan/step_time.cpp): a compute stream and one link that runs the
// engine's collectives in the order they are issued.
#pragma once

#include "plan/plan_internal.h"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace dtrain::plan::detail {

class StepClock {
 public:
  // Work on the compute stream.
  void compute(double seconds) {
    now_ += seconds;
    time_.compute_seconds += seconds;
  }
  // A collective issued now; returns when it completes. The link takes one
  // at a time, in issue order (the Communicator's one thread per rank).
  double issue(double seconds) {
    link_free_ = std::max(link_free_, now_) + seconds;
    time_.communication_seconds += seconds;
    const double held = share_ * seconds;  // the cores it takes from compute
    now_ += held;
    time_.exposed_communication_seconds += held;
    return link_free_;
  }
  // ComputeRates::communication_share.
  void set_communication_share(double share) { share_ = share; }
  // The compute stream waits for a collective that completes at `done`.
  void wait(double done) {
    if (done <= now_) return;
    time_.exposed_communication_seconds += done - now_;
    now_ = done;
  }
  // Everything issued so far.
  void wait_all() { wait(link_free_); }
  // A collective the compute stream runs in line (the model's own).
  void in_line(double seconds) {
    wait_all();
    now_ += seconds;
    time_.communication_seconds += seconds;
    time_.exposed_communication_seconds += seconds;
  }
  // A wait for another rank (a pipeline neighbour).
  void idle_until(double when) {
    if (when <= now_) return;
    time_.bubble_seconds += when - now_;
    now_ = when;
  }
  double now() const { return now_; }
  StepTime finish() {
    wait_all();
    time_.seconds = now_;
    return time_;
  }

 private:
  double now_ = 0, link_free_ = 0, share_ = 0;
  StepTime time_;
};

// The seconds of each part of a step at the layout's rates.
struct StepCosts {
  StepCosts(const ModelSpec& model, const Layout& layout, const FSDPOptions& fsdp);
  bool predicted = false;            // rates and links known
  std::vector<double> forward;       // per unit (the root's: before its children, the embeddings)
  double tail = 0;                   // the root's after its children: the head, the logits and the loss
  std::vector<double> gather;        // one all-gather of the unit (0: none on the wire)
  std::vector<double> reduce;        // its gradients' reductions, issued together
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
