#include "fsdp/reduction_order.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include <unordered_map>
#include <unordered_set>

namespace dtrain::detail {
namespace {

// Per unit: how many of its parameters the graph of `output` accumulates into.
std::vector<int64_t> reachable_parameters(const std::vector<std::unique_ptr<Unit>>& units, const torch::Tensor& output) {
  std::unordered_map<const c10::TensorImpl*, size_t> unit_of;
  for (size_t u = 0; u < units.size(); ++u) {
    for (const auto& entry : units[u]->flat().entries()) unit_of[entry.param.unsafeGetTensorImpl()] = u;
  }
  std::vector<int64_t> counts(units.size(), 0);
  std::vector<torch::autograd::Node*> stack;
  std::unordered_set<torch::autograd::Node*> seen;
  if (auto root = output.grad_fn()) stack.push_back(root.get());
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto* accumulate = dynamic_cast<torch::autograd::AccumulateGrad*>(node)) {
      auto it = unit_of.find(accumulate->variable.unsafeGetTensorImpl());
      if (it != unit_of.end()) ++counts[it->second];
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  return counts;
}

}  // namespace

ReductionOrder agree_on_reduction_order(Communicator& comm, const std::vector<std::unique_ptr<Unit>>& units,
                                        const std::vector<Unit*>& this_forward, const torch::Tensor& output) {
  const auto counts = reachable_parameters(units, output);
  const auto n = static_cast<int64_t>(units.size());
  // [used per unit, complete per unit, forward order], then the same negated:
  // one MAX all-reduce gives every entry's maximum and minimum over ranks.
  auto signature = torch::zeros({2 * (2 * n + 1)}, torch::kInt64);
  auto s = signature.accessor<int64_t, 1>();
  for (int64_t u = 0; u < n; ++u) {
    const int64_t expected = units[static_cast<size_t>(u)]->expected_gradients();
    s[u] = counts[static_cast<size_t>(u)] > 0 ? 1 : 0;
    s[n + u] = expected > 0 && counts[static_cast<size_t>(u)] == expected ? 1 : 0;
  }
  int64_t order = 0;
  for (const Unit* unit : this_forward) order = (order * 1000003 + unit->index() + 1) % 2147483647;
  s[2 * n] = order;
  for (int64_t i = 0; i <= 2 * n; ++i) s[2 * n + 1 + i] = -s[i];
  comm.blocking().all_reduce(signature, ReduceOp::Max);

  ReductionOrder result;
  result.used_anywhere.resize(units.size());
  for (int64_t i = 0; i <= 2 * n; ++i) {
    if (s[i] != -s[2 * n + 1 + i]) result.eager = false;  // the maximum is not the minimum: ranks differ
  }
  for (int64_t u = 0; u < n; ++u) result.used_anywhere[static_cast<size_t>(u)] = s[u] > 0 ? 1 : 0;
  return result;
}

}  // namespace dtrain::detail
