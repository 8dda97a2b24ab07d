// Gradient clipping by the global norm, over replicated or sharded gradients:
// the arithmetic both engines share (include/dtrain/grad_norm.h).
#include <dtrain/grad_norm.h>

#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <stdexcept>

namespace dtrain {

double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm, double norm_type,
                      Communicator* shards_across) {
  if (!(norm_type > 0)) {
    throw std::invalid_argument("clip_grad_norm: norm_type must be positive or infinity, got " +
                                std::to_string(norm_type));
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  const bool infinity = std::isinf(norm_type);
  const bool sharded = shards_across != nullptr && shards_across->size() > 1;
  // A rank may hold no gradients (an empty shard) and still take part in the
  // all-reduce below.
  if (grads.empty() && !sharded) return 0.0;

  torch::Tensor total;
  if (!sharded) {
    // The same arithmetic as torch::nn::utils::clip_grad_norm_, so replicated
    // gradients give bit-identical results.
    std::vector<torch::Tensor> norms;
    for (const auto& g : grads) norms.push_back(infinity ? g.abs().max() : g.norm(norm_type));
    total = norms.size() == 1 ? norms[0] : (infinity ? torch::max(torch::stack(norms)) : torch::stack(norms).norm(norm_type));
  } else {
    // Each rank contributes sum |g|^p (or max |g|) of its shard; one all-reduce.
    auto local = torch::zeros({1}, torch::kFloat64);
    for (const auto& g : grads) {
      if (g.numel() == 0) continue;
      auto piece = infinity ? g.abs().max().to(torch::kFloat64).cpu()
                            : g.to(torch::kFloat64).abs().pow(norm_type).sum().cpu();
      local = infinity ? torch::maximum(local, piece) : local + piece;
    }
    shards_across->blocking().all_reduce(local, infinity ? ReduceOp::Max : ReduceOp::Sum);
    total = infinity ? local[0] : local[0].pow(1.0 / norm_type);
  }
  // Multiplying by the clamped coefficient tensor, as torch does, keeps the
  // replicated case bit-identical to clip_grad_norm_.
  auto coefficient = torch::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (auto& g : grads) g.mul_(coefficient);
  const double total_norm = total.item<double>();
  return total_norm;
}

double clip_grad_norm_of_parts(const std::vector<torch::Tensor>& parameters, const std::vector<double>& weights,
                               double max_norm, const std::vector<Communicator*>& sum_over) {
  if (parameters.size() != weights.size())
    throw std::invalid_argument("clip_grad_norm_of_parts: " + std::to_string(parameters.size()) + " parameters but " +
                                std::to_string(weights.size()) + " weights");
  torch::NoGradGuard no_grad;
  auto local = torch::zeros({1}, torch::kFloat64);
  std::vector<torch::Tensor> grads;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const torch::Tensor& g = parameters[i].grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    if (g.numel() == 0 || weights[i] == 0) continue;
    local += g.to(torch::kFloat64).pow(2).sum() * weights[i];
  }
  for (Communicator* comm : sum_over) {
    if (comm != nullptr && comm->size() > 1) comm->blocking().all_reduce(local, ReduceOp::Sum);
  }
  const torch::Tensor total = local[0].sqrt().to(torch::kFloat32);
  const auto coefficient = torch::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (auto& g : grads) g.mul_(coefficient);
  return total.item<double>();
}

}  // namespace dtrain
