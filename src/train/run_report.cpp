#include "train/run_report.h"

#include "train/checkpointing.h"
#include "train/model.h"
#include "train/progress.h"
#include "train/stragglers.h"

#include "dtrain/trace_writer.h"

#include <cmath>
#include <iostream>
#include <sstream>
#include <utility>

namespace dtrain::train {

std::string format_parameters(int64_t n) {
  std::ostringstream text;
  text.precision(3);
  if (n >= 1'000'000)
    text << static_cast<double>(n) / 1e6 << "M";
  else
    text << format_count(n);
  return text.str();
}

std::string per_rank_bytes(const std::vector<int64_t>& bytes) {
  std::string text;
  for (size_t rank = 0; rank < bytes.size(); ++rank) text += (rank == 0 ? "" : " | ") + format_bytes(bytes[rank]);
  return text;
}

std::string describe_model(const TrainConfig& c) {
  const ModelSpec& spec = model_spec(c);
  return spec.describe ? spec.describe(c) : spec.name;
}

std::string format_eval(const Evaluation& e) {
  std::ostringstream text;
  text.setf(std::ios::fixed);
  text.precision(4);
  text << "loss " << e.loss;
  if (e.accuracy) {
    text.precision(2);
    text << ", accuracy " << 100 * *e.accuracy << "%";
  }
  return text.str();
}

nlohmann::ordered_json eval_record(int64_t step, const Evaluation& e) {
  nlohmann::ordered_json record{{"step", step}, {"eval_loss", e.loss}};
  if (e.accuracy) record["eval_accuracy"] = *e.accuracy;
  return record;
}

std::string eval_line(int64_t step, const Evaluation& e) {
  return "eval at step " + std::to_string(step) + ": " + format_eval(e);
}

std::string checkpoint_line(const std::string& dir, int64_t step, bool background) {
  if (background)
    return "checkpoint: step " + std::to_string(step) + " staged; writing " + checkpoint_path(dir, step) +
           " in the background";
  return "checkpoint: step " + std::to_string(step) + " saved in " + checkpoint_path(dir, step);
}

std::string prefetch_line(const TrainConfig& config, const TrainResult& result) {
  std::string line = "fsdp prefetch: " + result.fsdp_prefetch;
  if (result.prefetch_with_s <= 0 && result.prefetch_without_s <= 0) {
    return line + (config.fsdp_prefetch == "auto" ? " (the run ended before --fsdp-prefetch auto had timed its 2 "
                                                    "warm-up and 6 trial steps)"
                                                  : " (--fsdp-prefetch " + config.fsdp_prefetch + ")");
  }
  char medians[160];
  std::snprintf(medians, sizeof medians, " (tuned: median step %.4f s with prefetch, %.4f s without, slowest rank)",
                result.prefetch_with_s, result.prefetch_without_s);
  return line + medians;
}

std::string skipped_line(int64_t step, double loss, double grad_norm) {
  return "step " + std::to_string(step) + " skipped: the loss is " + std::to_string(loss) +
         (std::isfinite(grad_norm) ? "" : ", the gradient norm " + std::to_string(grad_norm));
}

std::string balance_line(int64_t step, const std::vector<int64_t>& local_batch_sizes) {
  return "balance: after step " + std::to_string(step) + " the local batches are " + format_split(local_batch_sizes) +
         " (by measured samples/s)";
}

std::string diverged_message(const TrainConfig& c, int64_t step, double loss) {
  const std::string checkpoints = c.checkpoint_dir.empty() ? std::string("no --checkpoint-dir was given")
                                                           : "the checkpoints in " + c.checkpoint_dir + " are intact";
  return "the loss is " + std::to_string(loss) + " at step " + std::to_string(step) + ": training diverged (" +
         checkpoints + "); try a lower --lr, more --warmup or --grad-clip, or --on-nonfinite skip";
}

std::map<std::string, std::string> run_description(const TrainConfig& c, int64_t total) {
  std::map<std::string, std::string> description{{"model", c.model},
                                                 {"data", c.data},
                                                 {"batch_size", std::to_string(c.batch_size)},
                                                 {"seed", std::to_string(c.seed)},
                                                 {"total_steps", std::to_string(total)}};
  // For `dtrain checkpoint inspect`: the mesh it was saved on (any mesh loads it).
  // The architecture as Hugging Face's config.json, for `dtrain checkpoint export --format hf`.
  // A model of one's own: its --model-option settings, for `dtrain checkpoint inspect`.
  for (const auto& [key, value] : c.model_options) description["model_option." + key] = value;
  if (const auto& adapter = model_spec(c).hugging_face)
    description["hf_config"] = adapter->write_config(c, c.model_config_json);
  if (c.cp > 1) description["cp"] = std::to_string(c.cp);
  if (c.tp > 1) description["tp"] = std::to_string(c.tp) + (c.sequence_parallel ? " (sequence parallel)" : "");
  return description;
}

std::vector<std::string> resume_differences(const std::map<std::string, std::string>& saved,
                                            const std::map<std::string, std::string>& now) {
  static const std::map<std::string, std::pair<std::string, std::string>> meaning = {
      {"data", {"--data", "training continues on other data"}},
      {"batch_size", {"--batch-size", "the global batch, and so each step's samples, differ from here on"}},
      {"seed", {"--seed", "the data order differs from here on"}},
      {"total_steps", {"--steps", "the learning-rate schedule is stretched to the new length from here on"}}};
  std::vector<std::string> lines;
  for (const auto& [key, what] : meaning) {
    const auto old_value = saved.find(key), new_value = now.find(key);
    if (old_value == saved.end() || new_value == now.end() || old_value->second == new_value->second) continue;
    lines.push_back(what.first + " " + new_value->second + " differs from the checkpoint's " + old_value->second +
                    ": " + what.second);
  }
  return lines;
}

void write_trace_if_asked(const TrainConfig& config, Communicator& world, bool printing) {
  if (config.trace_path.empty()) return;
  trace::write(config.trace_path, world);  // rank 0 writes every rank's events
  if (printing)
    std::cout << "trace: " << config.trace_path << " (open in https://ui.perfetto.dev; dtrain trace summary "
              << config.trace_path << ")" << std::endl;
}

}  // namespace dtrain::train
