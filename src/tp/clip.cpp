// Gradient clipping across tensor-parallel slices (tensor_parallel.h).
#include "dtrain/tensor_parallel.h"

#include <dtrain/grad_norm.h>

#include <stdexcept>

namespace dtrain::tp {

double clip_grad_norm(const std::vector<torch::Tensor>& parameters, const std::vector<bool>& split, double max_norm,
                      Communicator* shards_across, Communicator& group) {
  if (parameters.size() != split.size())
    throw std::invalid_argument("tp::clip_grad_norm: " + std::to_string(parameters.size()) + " parameters but " +
                                std::to_string(split.size()) + " split flags");
  // Each replicated gradient is on every rank of the group: count 1/size of
  // it on each, so that one sum over the group counts it once.
  std::vector<double> weights;
  for (bool is_split : split) weights.push_back(is_split ? 1.0 : 1.0 / group.size());
  return clip_grad_norm_of_parts(parameters, weights, max_norm, {shards_across, &group});
}

}  // namespace dtrain::tp
