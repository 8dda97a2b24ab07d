// Gradient clipping across tensor-parallel slices (tensor_parallel.h).
#include "dtrain/tensor_parallel.h"

#include <torch/utils.h>

#include <stdexcept>

namespace dtrain::tp {

double clip_grad_norm(const std::vector<torch::Tensor>& parameters, const std::vector<bool>& split, double max_norm,
                      Communicator* shards_across, Communicator& group) {
  if (parameters.size() != split.size())
    throw std::invalid_argument("tp::clip_grad_norm: " + std::to_string(parameters.size()) + " parameters but " +
                                std::to_string(split.size()) + " split flags");
  torch::NoGradGuard no_grad;
  // Each replicated gradient is on every rank of the group: count 1/size of
  // it on each, so that one sum over the group counts it once.
  const double replicated_weight = 1.0 / group.size();
  auto local = torch::zeros({1}, torch::kFloat64);
  std::vector<torch::Tensor> grads;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const torch::Tensor& g = parameters[i].grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    if (g.numel() == 0) continue;
    const auto squares = g.to(torch::kFloat64).pow(2).sum();
    local += split[i] ? squares : squares * replicated_weight;
  }
  if (shards_across != nullptr && shards_across->size() > 1) shards_across->blocking().all_reduce(local, ReduceOp::Sum);
  group.blocking().all_reduce(local, ReduceOp::Sum);
  const torch::Tensor total = local[0].sqrt().to(torch::kFloat32);
  const auto coefficient = torch::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (auto& g : grads) g.mul_(coefficient);
  return total.item<double>();
}

}  // namespace dtrain::tp
