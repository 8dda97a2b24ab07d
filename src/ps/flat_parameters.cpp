#include "ps/flat_parameters.h"

#include <ATen/core/grad_mode.h>

#include <stdexcept>
#include <string>

namespace dtrain::ps {
namespace {

int64_t count_elements(const std::vector<torch::Tensor>& parameters) {
  int64_t total = 0;
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (parameters[i].scalar_type() != torch::kFloat)
      throw std::invalid_argument("parameter server: parameter " + std::to_string(i) + " is " +
                                  dtype_name(parameters[i].scalar_type()) +
                                  "; servers keep float32 parameters (train the model in float32)");
    total += parameters[i].numel();
  }
  return total;
}

}  // namespace

torch::Tensor agree_on_initial_parameters(const Group& group, const std::vector<torch::Tensor>& parameters) {
  const int64_t total = count_elements(parameters);
  // max(total) and max(-total) = -min(total) in one all-reduce.
  auto counts = torch::tensor({total, -total}, torch::kInt64);
  group.world()->blocking().all_reduce(counts, ReduceOp::Max);
  const int64_t most = counts[0].item<int64_t>(), fewest = -counts[1].item<int64_t>();
  if (most != fewest)
    throw CommError("parameter server: ranks hold models of different sizes (" + std::to_string(fewest) + " to " +
                    std::to_string(most) + " parameter elements; this rank " + std::to_string(total) +
                    "): build the same model on every rank, workers and servers");
  torch::Tensor flat = torch::empty({total}, torch::kFloat);
  int64_t offset = 0;
  for (const auto& p : parameters) {
    flat.narrow(0, offset, p.numel()).copy_(p.detach().reshape(-1));
    offset += p.numel();
  }
  group.world()->blocking().broadcast(flat, 0);
  return flat;
}

torch::Tensor flatten_gradients(const std::vector<torch::Tensor>& parameters) {
  int64_t total = 0;
  for (const auto& p : parameters) total += p.numel();
  torch::Tensor flat = torch::zeros({total}, torch::kFloat);
  int64_t offset = 0;
  for (const auto& p : parameters) {
    if (p.grad().defined()) flat.narrow(0, offset, p.numel()).copy_(p.grad().reshape(-1));
    offset += p.numel();
  }
  return flat;
}

void copy_into_parameters(const torch::Tensor& flat, const std::vector<torch::Tensor>& parameters) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (const auto& p : parameters) {
    p.copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
}

}  // namespace dtrain::ps
