#include "train/metrics.h"

#include "train/step_loop.h"

#include "dtrain/float8.h"
#include "dtrain/train.h"
#include "train/stop_signals.h"

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace dtrain::train {

nlohmann::ordered_json final_record(const TrainConfig& config, const TrainResult& result, int64_t parameters) {
  auto or_null = [](const std::optional<double>& value) {
    return value ? nlohmann::ordered_json(*value) : nlohmann::ordered_json(nullptr);
  };
  return {{"final", true},
          {"steps", result.steps},
          {"loss", result.loss},
          {"eval_loss", or_null(result.eval_loss)},
          {"eval_accuracy", or_null(result.eval_accuracy)},
          {"world_size", result.world_size},
          {"strategy", config.strategy},
          {"model", config.model},
          {"activation_checkpointing", config.activation_checkpointing},
          {"fp8", config.fp8 == "off" ? nlohmann::ordered_json(nullptr)
                                      : nlohmann::ordered_json{{"scaling", config.fp8},
                                                               {"min_width", config.fp8_min_width},
                                                               {"all_gather", config.fp8 == "tensorwise" &&
                                                                                      config.fp8_all_gather},
                                                               {"fp8_calls", float8_calls().fp8},
                                                               {"plain_calls", float8_calls().plain}}},
          {"parameters", parameters},
          {"batch_size", config.batch_size},
          {"step_time_s_median", result.step_time_s_median},
          {"peak_memory_bytes", result.peak_memory_bytes},
          {"construction_peak_bytes", result.construction_peak_bytes},
          {"step_peak_bytes", result.step_peak_bytes},
          {"peak_memory_bytes_per_rank", result.peak_memory_bytes_per_rank},
          {"peak_rss_bytes", result.peak_rss_bytes},
          {"resumed_from_step", result.resumed_from_step},
          {"skipped_steps", result.skipped_steps},
          {"restarts", result.restarts},
          {"steps_lost", result.steps_lost},
          {"fsdp_prefetch", result.fsdp_prefetch.empty() ? nlohmann::ordered_json(nullptr)
                                                          : nlohmann::ordered_json{{"prefetch", result.fsdp_prefetch},
                                                                                   {"with_s", result.prefetch_with_s},
                                                                                   {"without_s", result.prefetch_without_s}}},
          {"stopped_by", result.stopped_by_signal != 0 ? nlohmann::ordered_json(signal_name(result.stopped_by_signal))
                                                       : nlohmann::ordered_json(nullptr)}};
}

MetricsWriter::MetricsWriter(const std::string& path, bool append) : path_(path) {
  file_.open(path, std::ios::out | (append ? std::ios::app : std::ios::trunc));
  if (!file_)
    throw std::runtime_error("cannot create the metrics file '" + path + "': " + std::strerror(errno) +
                             " (does its folder exist?)");
}

void MetricsWriter::write(const nlohmann::ordered_json& record) {
  if (!enabled()) return;
  // dump() writes NaN and infinity as null, which keeps every line valid JSON.
  file_ << record.dump() << '\n';
  file_.flush();
  if (!file_) throw std::runtime_error("cannot write to the metrics file '" + path_ + "'");
}

void StepLog::record(int64_t done, int64_t total, double loss, double lr, double step_seconds,
                     double units_per_step, const StepOutcome& outcome) {
  window_seconds_ += step_seconds;
  ++window_steps_;
  // A line for every multiple of log_every reached, even when `done` jumped
  // over it (a parameter-server worker whose late push was dropped).
  if (logged_ < 0) logged_ = done - 1;  // the first step of this run (or of a resumed one)
  const bool crossed = done / log_every_ > logged_ / log_every_;
  if (!crossed && done != total) return;
  logged_ = done;
  const double step_time = window_seconds_ / static_cast<double>(window_steps_);
  nlohmann::ordered_json line = {{"step", done}, {"loss", loss}, {"lr", lr}, {"step_time_s", step_time},
                                 {rate_key_, units_per_step / step_time}};
  if (utilization_.known()) {
    line["mfu"] = utilization_.mfu(units_per_step / step_time);
    line["peak_tflops"] = utilization_.peak_flops / 1e12;
  }
  if (!outcome.device_reserved_bytes_per_rank.empty()) {
    line["cuda_allocated_peak_bytes"] = outcome.peak_bytes_per_rank;
    line["cuda_reserved_peak_bytes"] = outcome.device_reserved_bytes_per_rank;
  }
  metrics_.write(line);
  window_seconds_ = 0;
  window_steps_ = 0;
}

}  // namespace dtrain::train
