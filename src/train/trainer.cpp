// run_training (include/dtrain/train.h): the training loop every rank runs.
//
// Note [global batch loss]
// Step s's global batch holds B samples; rank r of W computes a contiguous
// part of b_r of them (data::DistributedSampler). Let S_r be the sum of rank
// r's per-sample losses. Each rank backpropagates S_r * W / B, which is its
// mean loss scaled by b_r * W / B. DDP averages gradients over the W ranks, so
// every rank ends with the gradient of (1/W) * sum_r S_r * W / B
// = sum_r S_r / B: the gradient of the global batch's mean loss, exactly what
// one process computes on all B samples (W = 1: S / B), however unevenly B
// splits. The loss reported is all_reduce(Sum, S_r) / B, the same number on
// every rank. A strategy must keep this contract: after backward, each rank's
// gradients (or gradient shards) are the average over ranks of what each
// rank's backward produced.
#include "dtrain/train.h"

#include "dtrain/data.h"
#include "dtrain/memory.h"
#include "dtrain/trace.h"
#include "train/checkpointing.h"
#include "train/evaluate.h"
#include "train/initial_weights.h"
#include "train/lr_schedule.h"
#include "train/memory_summary.h"
#include "train/metrics.h"
#include "train/model.h"
#include "train/optimizer.h"
#include "train/progress.h"
#include "train/ps_training.h"
#include "train/samples.h"
#include "train/stop_signals.h"
#include "train/stragglers.h"
#include "train/strategy.h"
#include "train/training_data.h"
#include "common/timing.h"

#include <ATen/Parallel.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <deque>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dtrain {
namespace {

using Clock = SteadyClock;

double mean(const std::deque<double>& values) {
  return values.empty() ? 0 : std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

std::string format_parameters(int64_t n) {
  std::ostringstream text;
  text.precision(3);
  if (n >= 1'000'000)
    text << static_cast<double>(n) / 1e6 << "M";
  else
    text << train::format_count(n);
  return text.str();
}

std::string per_rank_bytes(const std::vector<int64_t>& bytes) {
  std::string text;
  for (size_t rank = 0; rank < bytes.size(); ++rank) text += (rank == 0 ? "" : " | ") + train::format_bytes(bytes[rank]);
  return text;
}

std::string describe_model(const TrainConfig& c) {
  std::ostringstream text;
  if (c.model == "mlp") {
    text << "mlp (hidden";
    for (size_t i = 0; i < c.mlp_hidden.size(); ++i) text << (i == 0 ? " " : ",") << c.mlp_hidden[i];
    text << ")";
  } else if (c.model == "gpt") {
    text << "gpt (" << c.gpt_layers << (c.gpt_layers == 1 ? " layer" : " layers") << ", dim " << c.gpt_dim << ", " << c.gpt_heads << " heads, context "
         << c.seq_len << ")";
  } else {
    text << c.model;
  }
  return text.str();
}

std::string format_eval(const train::Evaluation& e) {
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

nlohmann::ordered_json eval_record(int64_t step, const train::Evaluation& e) {
  nlohmann::ordered_json record{{"step", step}, {"eval_loss", e.loss}};
  if (e.accuracy) record["eval_accuracy"] = *e.accuracy;
  return record;
}

// What a checkpoint records about the run besides the tensors: `dtrain
// checkpoint inspect` shows it, and a resumed run says where it differs
// (resume_differences).
std::map<std::string, std::string> run_description(const TrainConfig& c, int64_t total) {
  return {{"model", c.model},
          {"data", c.data},
          {"batch_size", std::to_string(c.batch_size)},
          {"seed", std::to_string(c.seed)},
          {"total_steps", std::to_string(total)}};
}

// One line per setting this run changes from the checkpoint's, with what it
// means for the steps after it. None is an error: continuing with a new
// schedule or more steps is a common and deliberate choice; but the result
// is then not the uninterrupted run's, and the user should know.
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

std::string checkpoint_note(const TrainConfig& c) {
  return c.checkpoint_dir.empty() ? std::string("no --checkpoint-dir was given")
                                  : "the checkpoints in " + c.checkpoint_dir + " are intact";
}

}  // namespace

TrainResult run_training(const TrainConfig& config, CommPtr world) {
  if (!world) throw std::invalid_argument("run_training: the communicator is null; pass the one dtrain::init() returned");
  const int world_size = world->size();
  const int rank = world->rank();
  check_train_config(config, world_size);
  // The parameter server has its own loop (servers and workers), sharing this file's parts.
  if (train::is_parameter_server(config.strategy)) return train::run_parameter_server(config, world);
  const bool printing = config.print && rank == 0;
  memory::install_tracking_allocator();
  const train::TrainingData data = train::load_training_data(config);
  // Rebuilt with --balance's local batch sizes (src/train/stragglers.h).
  std::optional<data::DistributedSampler> sampler;
  auto make_sampler = [&](std::vector<int64_t> local_batch_sizes) {
    sampler.emplace(data::SamplerOptions{.dataset_size = data.train->size(),
                                         .global_batch_size = config.batch_size,
                                         .world_size = world_size,
                                         .rank = rank,
                                         .seed = config.seed,
                                         .shuffle = config.shuffle,
                                         .local_batch_sizes = std::move(local_batch_sizes)});
  };
  make_sampler({});
  train::Stragglers stragglers(config, rank, rank, world_size);  // --slow-rank, --balance
  const int64_t total = config.steps > 0 ? config.steps : sampler->steps_for_epochs(config.epochs);
  // Created once the data is known to fit, so a bad run leaves an old file alone.
  // A resumed run appends to the metrics file of the run it continues.
  train::MetricsWriter metrics;
  if (rank == 0 && !config.metrics_path.empty()) metrics = train::MetricsWriter(config.metrics_path, config.resume);

  // The peak counts what training allocates (model, gradients, optimizer
  // state, activations, communication buffers), not the datasets.
  const int64_t baseline = memory::live_bytes();
  memory::reset_peak();
  auto training_bytes = [baseline] { return std::max<int64_t>(0, memory::peak_bytes() - baseline); };

  // Construction: the sharded strategies build the model deferred and
  // materialise each unit straight into this rank's shards, so no rank holds
  // the whole model (dtrain/deferred_init.h); single and ddp hold a replica.
  const bool deferred = train::builds_deferred(config.strategy);
  memory::set_phase("construction of the model", train::construction_advice(config, world_size));
  torch::manual_seed(config.seed);  // the same weights on every rank
  train::Model model = train::build_model(config, deferred);
  auto strategy = train::wrap_model(
      model, {.name = config.strategy, .compress = config.compress, .mixed_precision = config.mixed_precision}, world);
  if (!config.init_from.empty()) {
    memory::set_phase("load of --init-from " + config.init_from);
    strategy->load_initial_weights(config.init_from);
  }
  // Dropout then draws different masks on each rank, as on different samples.
  torch::manual_seed(config.seed + 1 + static_cast<uint64_t>(rank));
  auto optimizer = train::make_optimizer(
      strategy->optimizer_parameters(),
      {.name = config.optimizer, .lr = config.lr, .momentum = config.momentum, .weight_decay = config.weight_decay});

  TrainResult result;
  const train::LRSchedule schedule{.peak_lr = config.lr, .warmup_steps = config.warmup, .total_steps = total};
  const int64_t batch = config.batch_size;
  const double units_per_step = static_cast<double>(batch * data.units_per_sample);

  const int64_t eval_count =
      model.classification ? data.validation->size() : std::min(data.validation->size(), config.eval_windows);
  // Evaluation batches about as large as training's, so the peak memory stays
  // training's (at least 256 images, so tiny batches do not take thousands of calls).
  const int64_t eval_chunk = model.classification ? std::max<int64_t>(batch, 256) : batch;
  auto run_evaluation = [&] { return train::evaluate(*strategy, model, *data.validation, eval_count, eval_chunk, *world); };

  if (printing) {
    std::cout << "dtrain train: " << describe_model(config) << ", " << format_parameters(model.parameters)
              << " parameters" << (config.init_from.empty() ? "" : ", initial weights from " + config.init_from) << "\n"
              << "  data      " << data.description << "\n"
              << "  strategy  " << config.strategy << (config.compress != "none" ? " (" + config.compress + " compression)" : "")
              << " on " << world_size << (world_size == 1 ? " rank" : " ranks") << " (" << world->backend_name()
              << "), " << at::get_num_threads() << (at::get_num_threads() == 1 ? " thread" : " threads")
              << " per rank\n"
              << "  schedule  " << total << " steps of " << batch << " samples";
    if (config.epochs > 0) std::cout << " (" << config.epochs << (config.epochs == 1 ? " epoch" : " epochs") << ")";
    std::cout << ", " << config.optimizer << " lr " << config.lr;
    if (config.warmup > 0) std::cout << ", " << config.warmup << " warmup steps";
    std::cout << ", cosine decay to " << config.lr * schedule.final_fraction << std::endl;
  }

  // Continue where the newest checkpoint left off: weights, optimizer state,
  // this rank's random state; the step says where the sampler and the
  // learning-rate schedule are.
  int64_t first_step = 0;
  if (config.resume) {
    std::vector<std::string> rejected;
    const auto manifest = train::resume_from_latest(config.checkpoint_dir, *strategy, *optimizer, world, &rejected);
    if (printing) {
      for (const auto& reason : rejected) std::cout << "not resuming from " << reason << "\n";
      if (!manifest) {
        std::cout << "no checkpoint in " << config.checkpoint_dir << " yet: starting at step 0" << std::endl;
      } else {
        std::cout << "resuming from step " << manifest->step << " (" << train::checkpoint_path(config.checkpoint_dir, manifest->step)
                  << ", saved by " << manifest->strategy << " on " << manifest->world_size
                  << (manifest->world_size == 1 ? " rank" : " ranks") << ")" << std::endl;
        for (const auto& line : resume_differences(manifest->extra, run_description(config, total)))
          std::cout << "  note: " << line << "\n";
      }
    }
    if (manifest) {
      if (manifest->step > total)
        throw std::invalid_argument("the checkpoint to resume from is at step " + std::to_string(manifest->step) +
                                    ", past this run's " + std::to_string(total) + " steps: give more --steps");
      first_step = manifest->step;
      result.resumed_from_step = manifest->step;
      metrics.write({{"resumed_from_step", manifest->step}});
    }
  }
  std::optional<train::StopSignals> stop_signals;
  if (!config.checkpoint_dir.empty()) stop_signals.emplace();

  // Everything up to here (construction, --init-from, --resume) is the
  // start's peak; the steps' peak is measured from here on.
  auto construction_peaks = torch::zeros({world_size}, torch::kFloat64);
  construction_peaks[rank] = static_cast<double>(training_bytes());
  world->all_reduce(construction_peaks, ReduceOp::Sum)->wait();
  memory::reset_peak();
  const std::string step_advice = train::step_advice(config);

  result.world_size = world_size;
  std::vector<double> step_times;
  std::deque<double> recent;  // the last step times, for rate and ETA
  train::StepLog step_log(metrics, config.log_every, data.unit + "_per_s");
  std::vector<int64_t> peaks(static_cast<size_t>(world_size), 0);
  const bool live = config.live_progress.value_or(train::ProgressLine::stdout_is_terminal());
  train::ProgressLine progress(std::cout, printing && live, config.log_every);
  int64_t last_saved = first_step;
  auto save_checkpoint_at = [&](int64_t step) {
    try {
      train::save_training_checkpoint(config.checkpoint_dir, step, config.keep_last, *strategy, *optimizer, world,
                                      run_description(config, total));
    } catch (const std::exception& error) {
      throw std::runtime_error("cannot write the checkpoint of step " + std::to_string(step) + ": " + error.what() +
                               (last_saved > 0 ? "; the checkpoint of step " + std::to_string(last_saved) + " is untouched"
                                               : std::string()));
    }
    last_saved = step;
    if (printing) progress.message("checkpoint: step " + std::to_string(step) + " saved in " +
                                   train::checkpoint_path(config.checkpoint_dir, step));
  };

  const auto run_start = Clock::now();

  int64_t steps_done = total;  // less when a signal stops the run
  model.module->train();
  // --trace: this rank's timeline from here to the end of the loop (dtrain/trace.h).
  if (!config.trace_path.empty()) trace::start(rank);
  for (int64_t step = first_step; step < total; ++step) {
    trace::Span step_span("step", trace::category::step, {{"step", step + 1}});
    const auto start = Clock::now();
    const double lr = train::learning_rate(schedule, step);
    train::set_learning_rate(*optimizer, lr);
    const std::vector<int64_t> local_indices = sampler->local_batch(step);
    const data::Batch part = data.train->get_batch(local_indices);
    stragglers.begin();
    optimizer->zero_grad();
    torch::Tensor local_sum;
    {
      memory::set_phase("forward", step_advice);
      trace::Span span("forward", trace::category::compute);
      local_sum = train::per_sample_loss(strategy->forward(part.inputs), part.targets).sum();
    }
    if (step + 1 == config.debug_nan_at_step && rank == 0) local_sum = local_sum * std::nan("");
    {
      memory::set_phase("backward");
      trace::Span span("backward", trace::category::compute);
      // See Note [global batch loss].
      (local_sum * (static_cast<double>(world_size) / static_cast<double>(batch))).backward();
    }
    stragglers.end(static_cast<int64_t>(local_indices.size()), strategy->last_backward_wait_s());
    const double grad_norm = config.grad_clip > 0 ? strategy->clip_grad_norm(config.grad_clip) : 0.0;
    // --on-nonfinite skip: agree on the loss before the update, so that every
    // rank skips the same steps (the gradient norm is already global).
    bool skipped = false;
    if (config.on_nonfinite == "skip") {
      auto global_sum = local_sum.detach().to(torch::kFloat64).reshape({1}).clone();
      world->all_reduce(global_sum, ReduceOp::Sum)->wait();
      skipped = !std::isfinite(global_sum.item<double>()) || !std::isfinite(grad_norm);
    }
    if (!skipped) {
      memory::set_phase("optimizer step");
      trace::Span span("optimizer_step", trace::category::compute);
      strategy->optimizer_step(*optimizer);
    }
    trace::sample_memory();

    // One small all-reduce: the global loss, every rank's peak memory, and
    // whether a rank was asked to stop (SIGINT/SIGTERM; see stop_signals.h).
    auto stats = torch::zeros({2 + world_size}, torch::kFloat64);
    auto values = stats.accessor<double, 1>();
    values[0] = local_sum.item<double>();
    values[1] = static_cast<double>(train::StopSignals::received());
    values[2 + rank] = static_cast<double>(training_bytes());
    world->all_reduce(stats, ReduceOp::Sum)->wait();
    const double loss = values[0] / static_cast<double>(batch);
    const bool stop_requested = values[1] != 0;
    for (int r = 0; r < world_size; ++r) peaks[static_cast<size_t>(r)] = static_cast<int64_t>(values[2 + r]);
    const int64_t done = step + 1;
    if (auto sizes = stragglers.rebalance(done, *world)) {
      make_sampler(*sizes);
      if (printing) progress.message("balance: after step " + std::to_string(done) + " the local batches are " +
                                     train::format_split(*sizes) + " (by measured samples/s)");
    }
    if (skipped) {
      ++result.skipped_steps;
      if (printing) progress.message("step " + std::to_string(done) + " skipped: the loss is " + std::to_string(loss) +
                                     (std::isfinite(grad_norm) ? "" : ", the gradient norm " + std::to_string(grad_norm)));
    } else if (!std::isfinite(loss)) {
      throw std::runtime_error("the loss is " + std::to_string(loss) + " at step " + std::to_string(done) +
                               ": training diverged (" + checkpoint_note(config) +
                               "); try a lower --lr, more --warmup or --grad-clip, or --on-nonfinite skip");
    }

    const double step_seconds = seconds_since(start);
    step_times.push_back(step_seconds);
    result.losses.push_back(loss);
    recent.push_back(step_seconds);
    if (recent.size() > 20) recent.pop_front();

    if (printing) {
      const double recent_step = mean(recent);
      progress.update({.step = done,
                       .total = total,
                       .loss = loss,
                       .rate = units_per_step / recent_step,
                       .rate_unit = data.unit + "/s",
                       .eta_s = recent_step * static_cast<double>(total - done),
                       .peak_bytes_per_rank = peaks});
    }
    step_log.record(done, total, loss, lr, step_seconds, units_per_step);
    const bool checkpoint_due = !config.checkpoint_dir.empty() &&
                                ((config.checkpoint_every > 0 && done % config.checkpoint_every == 0) || done == total);
    if (checkpoint_due || (stop_requested && !config.checkpoint_dir.empty())) save_checkpoint_at(done);
    if (stop_requested) {
      // Every rank saw the request in the same all-reduce: all stop here.
      // (A rank that did not get the signal itself reports the usual one.)
      result.stopped_by_signal = train::StopSignals::received() != 0 ? train::StopSignals::received() : SIGTERM;
      steps_done = done;
      break;
    }
    if (config.eval_every > 0 && done % config.eval_every == 0 && done != total) {
      memory::set_phase("evaluation");
      const train::Evaluation evaluation = run_evaluation();
      if (printing) progress.message("eval at step " + std::to_string(done) + ": " + format_eval(evaluation));
      metrics.write(eval_record(done, evaluation));
    }
  }
  progress.finish();
  const double train_seconds = seconds_since(run_start);
  if (!config.trace_path.empty()) {
    trace::write(config.trace_path, *world);  // collective: rank 0 writes every rank's events
    if (printing) std::cout << "trace: " << config.trace_path << " (open in https://ui.perfetto.dev; dtrain trace summary "
                            << config.trace_path << ")" << std::endl;
  }

  // End of run: evaluate on the whole validation split (the full test set
  // for classification) and, for the GPT, write a few samples. A run stopped
  // by a signal skips both: it is to end promptly, and it will continue.
  const bool stopped = result.stopped_by_signal != 0;
  std::optional<train::Evaluation> final_eval;
  if (!stopped) {
    memory::set_phase("final evaluation");
    final_eval = run_evaluation();
    metrics.write(eval_record(total, *final_eval));
  }
  if (model.gpt && !stopped) {
    result.samples = train::generate_samples(
        model.gpt, {.count = config.samples, .bytes = config.sample_bytes, .prompt = config.sample_prompt, .seed = config.seed},
        [&](const torch::Tensor& tokens) { return strategy->forward(tokens); });
  }

  auto rss = torch::zeros({world_size}, torch::kFloat64);
  rss[rank] = static_cast<double>(memory::peak_rss_bytes());
  world->all_reduce(rss, ReduceOp::Sum)->wait();

  result.steps = steps_done;
  result.loss = result.losses.empty() ? 0 : result.losses.back();
  if (final_eval) {
    result.eval_loss = final_eval->loss;
    result.eval_accuracy = final_eval->accuracy;
  }
  result.step_time_s_median = median(step_times);
  result.step_peak_bytes = *std::max_element(peaks.begin(), peaks.end());
  for (int r = 0; r < world_size; ++r) {
    result.construction_peak_bytes = std::max(result.construction_peak_bytes,
                                              static_cast<int64_t>(construction_peaks[r].item<double>()));
    peaks[static_cast<size_t>(r)] = std::max(peaks[static_cast<size_t>(r)],
                                             static_cast<int64_t>(construction_peaks[r].item<double>()));
  }
  result.peak_memory_bytes_per_rank = peaks;
  result.peak_memory_bytes = *std::max_element(peaks.begin(), peaks.end());
  result.peak_rss_bytes = static_cast<int64_t>(rss.max().item<double>());

  nlohmann::ordered_json final_line = train::final_record(config, result, model.parameters);
  final_line["local_batch_sizes"] = stragglers.local_batch_sizes();  // --balance; [] = the even split
  final_line["train_time_s"] = train_seconds;
  metrics.write(final_line);

  if (stopped) {
    if (printing)
      std::cout << train::signal_name(result.stopped_by_signal) << ": stopped after step " << steps_done
                << "; checkpoint saved in " << train::checkpoint_path(config.checkpoint_dir, steps_done)
                << " (continue with the same command and --resume)" << std::endl;
    return result;
  }

  if (printing) {
    std::ostringstream text;
    text.setf(std::ios::fixed);
    if (final_eval->accuracy) {
      text.precision(2);
      text << "test accuracy: " << 100 * *final_eval->accuracy << "% on " << train::format_count(eval_count)
           << " test images (loss ";
      text.precision(4);
      text << final_eval->loss << ")\n";
    } else {
      text.precision(4);
      text << "validation loss: " << final_eval->loss << " (" << eval_count << " windows of " << config.seq_len
           << " bytes)\n";
      for (size_t i = 0; i < result.samples.size(); ++i) {
        text << "sample " << i + 1 << ":\n";
        std::istringstream lines(train::printable(result.samples[i]));
        for (std::string line; std::getline(lines, line);) text << "  | " << line << "\n";
      }
    }
    text.precision(3);
    text << "done: " << total << " steps";
    if (result.resumed_from_step > 0) text << " (" << total - result.resumed_from_step << " after resuming)";
    if (result.skipped_steps > 0) text << ", " << result.skipped_steps << " skipped (non-finite)";
    text << " in " << train::format_duration(train_seconds) << " (median step "
         << result.step_time_s_median << " s); peak memory per rank " << per_rank_bytes(peaks) << ", peak RSS "
         << train::format_bytes(result.peak_rss_bytes) << "\n";
    if (auto memory = train::memory_summary(config, world_size, result)) text << *memory << "\n";
    std::cout << text.str() << std::flush;
  }
  return result;
}

}  // namespace dtrain
