#include "train/step_loop.h"

#include "dtrain/memory.h"
#include "dtrain/trace.h"
#include "train/restarts.h"
#include "train/run_checkpoints.h"
#include "train/run_report.h"
#include "train/stop_signals.h"
#include "common/timing.h"

#include <csignal>
#include <cmath>
#include <iostream>
#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace dtrain::train {
namespace {

double mean(const std::deque<double>& values) {
  return values.empty() ? 0 : std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

}  // namespace

StepLoop::StepLoop(const TrainConfig& config, int64_t total, double units_per_step, const std::string& unit,
                   bool printing, MetricsWriter& metrics, Stragglers& stragglers, TrainResult& result)
    : config_(config),
      total_(total),
      units_per_step_(units_per_step),
      unit_(unit),
      printing_(printing),
      metrics_(metrics),
      stragglers_(stragglers),
      result_(result),
      progress_(std::cout, printing && config.live_progress.value_or(ProgressLine::stdout_is_terminal()),
                config.log_every),
      step_log_(metrics, config.log_every, unit + "_per_s") {
  const RestartState restarts = restart_state_from_environment();
  result_.restarts = restarts.restarts;
  result_.steps_lost = restarts.steps_lost;
}

double StepLoop::mfu_of(double step_seconds) const {
  return step_seconds > 0 ? step_log_.utilization().mfu(units_per_step_ / step_seconds) : 0;
}

double StepLoop::median_step_seconds() const {
  if (step_times_.empty()) return 0;
  std::vector<double> sorted = step_times_;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
  return sorted[sorted.size() / 2];
}

double StepLoop::median_mfu() const {
  const double seconds = median_step_seconds();
  return seconds > 0 ? mfu_of(seconds) : 0;
}

bool StepLoop::median_beat_the_peak() const {
  const double seconds = median_step_seconds();
  return seconds > 0 && step_log_.utilization().implausible(units_per_step_ / seconds);
}

void StepLoop::message(const std::string& text) {
  if (printing_) progress_.message(text);
}

int64_t StepLoop::run(StepSource& source) {
  // A restarted job's timeline says so at its start (the trace is the last attempt's).
  if (result_.restarts > 0)
    trace::instant("restart", "restart",
                   {{"restarts", result_.restarts}, {"steps_lost", result_.steps_lost},
                    {"resumed_from_step", result_.resumed_from_step}});
  while (source.next_step() < total_) {
    const int64_t before = source.next_step();
    trace::Span step_span("step", trace::category::step, {{"step", before + 1}});
    const auto start = SteadyClock::now();
    const StepOutcome outcome = source.run_step(before);
    const int64_t done = source.next_step();
    const double seconds = seconds_since(start);
    if (late_ && outcome.previous_loss) record_late(*outcome.previous_loss);
    rebalance(source, done);
    const bool saving_now = checkpoint_due(config_, before, done, total_) ||
                            (outcome.stop_requested && !config_.checkpoint_dir.empty());
    const bool evaluating_now = config_.eval_every > 0 && done % config_.eval_every == 0 && done != total_ &&
                                source.lockstep_ranks();
    if (outcome.loss_late) {
      late_ = LateStep{done, outcome, seconds};
      // What follows must see this step's loss: a checkpoint (never of a
      // diverged run), an evaluation's line, a stop, the end. Every rank
      // decides alike, so the collective read matches.
      if (saving_now || evaluating_now || outcome.stop_requested || done >= total_) record_late(source.settle_loss());
    } else {
      record(done, outcome, seconds);
    }
    if (saving_now) {
      // The time the training thread spends on it (--checkpoint-async: the
      // wait for the previous save and the copy to host memory only), for
      // the benchmark of checkpoint cost (docs/PERFORMANCE.md).
      const auto saving = SteadyClock::now();
      source.save_checkpoint(done);
      metrics_.write({{"step", done}, {"checkpoint_s", seconds_since(saving)}});
      message(checkpoint_line(config_.checkpoint_dir, done, config_.checkpoint_async));
    }
    after_step(done);  // the launcher's progress record (--max-restarts)
    if (outcome.stop_requested) {
      // Every rank saw the request in the same step: all stop here. (A rank
      // that did not get the signal itself reports the usual one.)
      result_.stopped_by_signal = StopSignals::received() != 0 ? StopSignals::received() : SIGTERM;
      return done;
    }
    if (evaluating_now) {
      memory::set_phase("evaluation");
      const Evaluation evaluation = source.evaluate();
      message(eval_line(done, evaluation));
      metrics_.write(eval_record(done, evaluation));
    }
  }
  if (late_) record_late(source.settle_loss());  // (a source that jumped past the total)
  return total_;
}

void StepLoop::record_late(double loss) {
  LateStep step = std::move(*late_);
  late_.reset();
  step.outcome.loss = loss;
  record(step.done, step.outcome, step.seconds);
}

// --balance: the ranks that meet every step share their measured rates and
// re-split the global batch.
void StepLoop::rebalance(StepSource& source, int64_t done) {
  Communicator* ranks = source.lockstep_ranks();
  if (!ranks) return;
  if (auto sizes = stragglers_.rebalance(done, *ranks)) {
    source.resplit(*sizes);
    message(balance_line(done, *sizes));
  }
}

// The non-finite rule, then the step's records and its progress line (the
// words come from run_report.h: the loop decides, the report says).
void StepLoop::record(int64_t done, const StepOutcome& outcome, double step_seconds) {
  if (outcome.skipped) {
    ++result_.skipped_steps;
    message(skipped_line(done, outcome.loss, outcome.grad_norm));
  } else if (!std::isfinite(outcome.loss) && config_.on_nonfinite != "skip") {
    // (With skip, a non-finite loss that was not skipped is a late ps-sync
    // push the servers dropped: nothing was applied.)
    throw std::runtime_error(diverged_message(config_, done, outcome.loss));
  }
  step_times_.push_back(step_seconds);
  result_.losses.push_back(outcome.loss);
  recent_.push_back(step_seconds);
  if (recent_.size() > 20) recent_.pop_front();
  if (printing_) {
    const double recent_step = mean(recent_);
    progress_.update({.step = done,
                      .total = total_,
                      .loss = outcome.loss,
                      .rate = units_per_step_ / recent_step,
                      .rate_unit = unit_ + "/s",
                      .eta_s = recent_step * static_cast<double>(total_ - done),
                      .peak_bytes_per_rank = outcome.peak_bytes_per_rank,
                      .mfu = mfu_of(recent_step)});
  }
  step_log_.record(done, total_, outcome.loss, outcome.lr, step_seconds, units_per_step_, outcome);
}

}  // namespace dtrain::train
