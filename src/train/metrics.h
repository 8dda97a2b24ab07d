// The --metrics file: JSON Lines, one object per line, written by rank 0 as
// training goes (each line is flushed, so a reader can follow a running job).
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace dtrain {
struct TrainConfig;
struct TrainResult;
}  // namespace dtrain

namespace dtrain::train {

struct StepOutcome;

// Model FLOPs utilisation: the model's FLOPs per sample or token
// (peak_flops.h) over the job's peak FLOP/s; either 0: unknown.
struct Utilization {
  double flops_per_unit = 0;
  double peak_flops = 0;
  bool known() const { return flops_per_unit > 0 && peak_flops > 0; }
  // At `units_per_s` samples or tokens per second; 0 when unknown, and when
  // the ratio passes 1: then the peak is wrong (a probe taken while the
  // cores were busy, a wrong --peak-tflops), and no MFU is shown rather
  // than an impossible one (implausible() says so).
  double ratio(double units_per_s) const { return known() ? units_per_s * flops_per_unit / peak_flops : 0; }
  double mfu(double units_per_s) const { return implausible(units_per_s) ? 0 : ratio(units_per_s); }
  bool implausible(double units_per_s) const { return ratio(units_per_s) > 1; }
};

// The fields every run's last metrics line has ("final": true, steps, loss,
// eval_loss, ..., stopped_by), from `result`; each loop adds its own after them.
nlohmann::ordered_json final_record(const TrainConfig& config, const TrainResult& result, int64_t parameters);

class MetricsWriter {
 public:
  // Writes nothing.
  MetricsWriter() = default;
  // Creates `path` afresh (an existing file is replaced), or with `append`
  // adds to it (a resumed run). Throws std::runtime_error naming the path
  // when it cannot be created, e.g. because its folder does not exist.
  explicit MetricsWriter(const std::string& path, bool append = false);

  bool enabled() const { return file_.is_open(); }
  // Appends `record` as one line and flushes it. Non-finite numbers are
  // written as null.
  void write(const nlohmann::ordered_json& record);

 private:
  std::string path_;
  std::ofstream file_;
};

// The per-step metrics lines of a training loop: every `log_every` steps and
// at the last one, {step, loss, lr, step_time_s, <unit>_per_s}, where the time
// and rate are averages over the steps since the previous line, so a line
// stands for its whole window and not only its last step.
class StepLog {
 public:
  StepLog(MetricsWriter& metrics, int64_t log_every, std::string rate_key)
      : metrics_(metrics), log_every_(log_every), rate_key_(std::move(rate_key)) {}

  // Step `done` of `total` took `step_seconds` on `units_per_step` samples
  // or tokens. With utilisation set, the line has the window's "mfu" and
  // "peak_tflops"; on a GPU, the caching allocator's peaks per rank so far
  // ("cuda_allocated_peak_bytes", "cuda_reserved_peak_bytes").
  void record(int64_t done, int64_t total, double loss, double lr, double step_seconds, double units_per_step,
              const StepOutcome& outcome);
  void set_utilization(const Utilization& utilization) { utilization_ = utilization; }
  const Utilization& utilization() const { return utilization_; }

 private:
  MetricsWriter& metrics_;
  int64_t log_every_;
  std::string rate_key_;
  double window_seconds_ = 0;
  int64_t window_steps_ = 0;
  int64_t logged_ = -1;  // the last step given a line; -1 before the first
  Utilization utilization_;
};

}  // namespace dtrain::train
