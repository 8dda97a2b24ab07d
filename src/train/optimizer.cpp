#include "train/optimizer.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <stdexcept>

namespace dtrain::train {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& parameters,
                                                        const OptimizerConfig& config) {
  if (config.name == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        parameters, torch::optim::SGDOptions(config.lr).momentum(config.momentum).weight_decay(config.weight_decay));
  }
  if (config.name == "adamw") {
    return std::make_unique<torch::optim::AdamW>(
        parameters, torch::optim::AdamWOptions(config.lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(config.weight_decay));
  }
  throw std::invalid_argument("unknown optimizer '" + config.name + "': use sgd or adamw");
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace dtrain::train
