// The step loop every training run shares (issue 17, item 2): the data-parallel
// strategies and the parameter server's workers differ only in what one step
// does (a StepSource); the loop around it is one: timing, the non-finite rule,
// the per-step records and progress, --balance, checkpoints, a stop request
// and evaluation during training.
#pragma once

#include "dtrain/comm.h"
#include "dtrain/train.h"
#include "train/evaluate.h"
#include "train/metrics.h"
#include "train/progress.h"
#include "train/stragglers.h"

#include <cstdint>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::train {

// What one step ends with on this rank.
struct StepOutcome {
  double loss = 0;  // the global batch's mean loss (asynchronous parameter server: this worker's part's)
  double lr = 0;
  double grad_norm = 0;  // before clipping; 0 unless --grad-clip or --on-nonfinite skip needed it
  bool skipped = false;  // --on-nonfinite skip left the update out
  bool stop_requested = false;  // SIGINT/SIGTERM on some rank (every rank learns it in the same step)
  std::vector<int64_t> peak_bytes_per_rank;  // for the progress line (on a GPU: the caching allocator's allocated)
  std::vector<int64_t> device_reserved_bytes_per_rank;  // on a GPU: the caching allocator's reserved; else empty
  // Note [the loss one step late] (late_scalar.h): this step's loss is not
  // known yet (`loss` is meaningless); it comes as the next step's
  // previous_loss, or from StepSource::settle_loss().
  bool loss_late = false;
  std::optional<double> previous_loss;  // the last late step's loss, read in this step
};

// One strategy's side of the loop.
class StepSource {
 public:
  virtual ~StepSource() = default;
  // The step to run next: one more each step, except that a late ps-sync
  // worker (backup workers) jumps ahead to the servers' step.
  virtual int64_t next_step() const = 0;
  // Forward, backward and the update of step `step` (0-based).
  virtual StepOutcome run_step(int64_t step) = 0;
  // The ranks that meet every step, for --balance and evaluation during
  // training; nullptr where they do not (asynchronous parameter server).
  virtual Communicator* lockstep_ranks() = 0;
  // --balance: from now on, these local batch sizes.
  virtual void resplit(const std::vector<int64_t>& sizes) = 0;
  // Collective: the checkpoint of step `step`.
  virtual void save_checkpoint(int64_t step) = 0;
  // Collective over lockstep_ranks(): the validation loss (and accuracy) now.
  virtual Evaluation evaluate() = 0;
  // Collective: the loss of the last step whose outcome said loss_late,
  // read now (a source that never defers its loss has none to settle).
  virtual double settle_loss() { throw std::logic_error("settle_loss: this step source reads its loss at once"); }
};

class StepLoop {
 public:
  // `units_per_step` samples or tokens of `unit` ("samples") per global
  // batch; rank 0 prints when `printing`. Results go to `result` (losses,
  // skipped steps, the stop signal) and `metrics`.
  StepLoop(const TrainConfig& config, int64_t total, double units_per_step, const std::string& unit, bool printing,
           MetricsWriter& metrics, Stragglers& stragglers, TrainResult& result);

  // Runs steps from source.next_step() until `total` or a stop request;
  // returns the steps done (less than total when stopped by a signal).
  int64_t run(StepSource& source);

  // A line of its own on rank 0 (the live progress line is redrawn below it).
  void message(const std::string& text);
  // Ends the live progress line.
  void finish() { progress_.finish(); }
  const std::vector<double>& step_times() const { return step_times_; }

  // MFU on the progress line and in the metrics (unknown: left out).
  void set_utilization(const Utilization& utilization) { step_log_.set_utilization(utilization); }
  // The median step's MFU so far (0 when unknown or implausible).
  double median_mfu() const;
  // Whether the median step beat the peak (MFU above 1: the peak is wrong).
  bool median_beat_the_peak() const;

 private:
  void record(int64_t done, const StepOutcome& outcome, double step_seconds);
  // Records the step whose loss was late, with `loss`.
  void record_late(double loss);

  struct LateStep {
    int64_t done;
    StepOutcome outcome;
    double seconds;
  };
  std::optional<LateStep> late_;  // a step waiting for its loss (Note [the loss one step late])
  void rebalance(StepSource& source, int64_t done);

  const TrainConfig& config_;
  const int64_t total_;
  const double units_per_step_;
  const std::string unit_;
  const bool printing_;
  MetricsWriter& metrics_;
  Stragglers& stragglers_;
  TrainResult& result_;
  ProgressLine progress_;
  StepLog step_log_;
  std::vector<double> step_times_;
  std::deque<double> recent_;  // the last step times, for rate and ETA
  double mfu_of(double step_seconds) const;
  double median_step_seconds() const;
};

}  // namespace dtrain::train
