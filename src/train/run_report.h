// What a training run says about itself, apart from the loop that runs it:
// the banner's descriptions, evaluation lines, the checkpoint's description
// of the run and what a resumed run changes (issue 17: reporting reads the
// run's results; the loop never formats text).
#pragma once

#include "dtrain/comm.h"
#include "dtrain/train.h"
#include "train/evaluate.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain::train {

// "85.1M", "52,650"
std::string format_parameters(int64_t n);
// "1.2 MiB | 1.3 MiB": one entry per rank.
std::string per_rank_bytes(const std::vector<int64_t>& bytes);
// "gpt (2 layers, dim 64, 4 heads, context 64)"
std::string describe_model(const TrainConfig& c);
// "loss 1.2345, accuracy 56.78%"
std::string format_eval(const Evaluation& e);
// The metrics file's evaluation line.
nlohmann::ordered_json eval_record(int64_t step, const Evaluation& e);

// The lines the step loop shows between progress updates.
// "eval at step 100: loss 1.2345, accuracy 56.78%"
std::string eval_line(int64_t step, const Evaluation& e);
// "checkpoint: step 100 saved in ckpt/step-00000100"; in the background
// (--checkpoint-async): "checkpoint: step 100 staged; writing ... in the background".
std::string checkpoint_line(const std::string& dir, int64_t step, bool background = false);
// "fsdp prefetch: off (tuned: median step 0.612 s with, 0.598 s without, slowest rank)".
std::string prefetch_line(const TrainConfig& config, const TrainResult& result);
// "step 5 skipped: the loss is nan[, the gradient norm inf]"
std::string skipped_line(int64_t step, double loss, double grad_norm);
// "balance: after step 20 the local batches are 40 | 24 (by measured samples/s)"
std::string balance_line(int64_t step, const std::vector<int64_t>& local_batch_sizes);
// The error of a non-finite loss that was not skipped.
std::string diverged_message(const TrainConfig& c, int64_t step, double loss);

// What a checkpoint records about the run besides the tensors: `dtrain
// checkpoint inspect` shows it, and a resumed run says where it differs.
std::map<std::string, std::string> run_description(const TrainConfig& c, int64_t total);

// One line per setting this run changes from the checkpoint's, with what it
// means for the steps after it. None is an error: continuing with a new
// schedule or more steps is a common and deliberate choice; but the result
// is then not the uninterrupted run's, and the user should know.
std::vector<std::string> resume_differences(const std::map<std::string, std::string>& saved,
                                            const std::map<std::string, std::string>& now);

// --trace: stops recording and writes every rank's events to
// config.trace_path (collective over `world`: every rank calls it), then says
// where when `printing`. Does nothing without --trace.
void write_trace_if_asked(const TrainConfig& config, Communicator& world, bool printing);

}  // namespace dtrain::train
