#include "train/compute_probe.h"

#include "dtrain/train.h"
#include "train/model.h"
#include "train/training_data.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::train {

double time_forward_backward(const TrainConfig& config, int64_t batch) {
  const TrainingData data = load_training_data(config);
  if (data.train->size() < batch)
    throw std::invalid_argument("plan: timing the model needs " + std::to_string(batch) + " training samples, the data has " +
                                std::to_string(data.train->size()));
  torch::manual_seed(config.seed);
  Model model = build_model(config);
  model.module->train();
  std::vector<int64_t> indices(static_cast<size_t>(batch));
  std::iota(indices.begin(), indices.end(), 0);
  const data::Batch part = data.train->get_batch(indices);
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    const auto start = std::chrono::steady_clock::now();
    model.module->zero_grad();
    model.loss(model.forward(part.inputs), part.targets).sum().backward();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (round > 0) best = std::min(best, seconds);  // the first warms up the allocator and the kernels
  }
  return best;
}

}  // namespace dtrain::train
