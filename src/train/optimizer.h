// The optimizer a training run uses, by name.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <memory>
#include <string>
#include <vector>

namespace dtrain::train {

struct OptimizerConfig {
  std::string name = "sgd";  // sgd | adamw
  double lr = 0.05;
  double momentum = 0.9;      // sgd only
  double weight_decay = 0.0;  // sgd: L2 added to the gradient; adamw: decoupled
};

// SGD (with momentum) or AdamW (betas 0.9, 0.999, eps 1e-8) over `parameters`
// (the parameters this rank updates: the whole model, or its shards).
// Throws std::invalid_argument for an unknown name.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const std::vector<torch::Tensor>& parameters,
                                                        const OptimizerConfig& config);

// Sets every parameter group's learning rate (the schedule's value for a step).
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace dtrain::train
