// The data of a training run (--data fashion-mnist|text:PATH): its train and
// validation splits, loaded whole into memory.
#pragma once

#include "dtrain/data.h"
#include "dtrain/train.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtrain::train {

struct TrainingData {
  std::shared_ptr<data::Dataset> train;
  // Fashion-MNIST: the 10,000 test images. Text: the corpus's last 10%, in
  // non-overlapping windows.
  std::shared_ptr<data::Dataset> validation;
  // What one sample holds for throughput figures: 1 image, or seq_len tokens.
  int64_t units_per_sample = 1;
  std::string unit = "samples";  // "samples" or "tokens"
  std::string description;       // for the run's header line
};

// The model spec's own datasets (ModelSpec::data) when it has them, else
// --data's. Throws std::runtime_error when the data cannot be read.
TrainingData load_training_data(const TrainConfig& config);

// How rank `rank` of the `ranks` that read data samples its part of each
// global batch (--balance: `local_batch_sizes`; empty = the even split).
data::SamplerOptions sampler_options(const TrainConfig& config, const TrainingData& data, int ranks, int rank,
                                     std::vector<int64_t> local_batch_sizes);

// "text:PATH" -> PATH; "" for anything else.
std::string text_path(const std::string& data);
// "tokens:PATH" -> PATH; "" for anything else.
std::string tokens_path(const std::string& data);

}  // namespace dtrain::train
