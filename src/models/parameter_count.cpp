#include "dtrain/models.h"

#include <unordered_set>

namespace dtrain::models {

int64_t parameter_count(const torch::nn::Module& module) {
  // A tensor registered under two names (shared weights) is one set of
  // numbers to store, communicate and optimise: count it once.
  std::unordered_set<const c10::TensorImpl*> seen;
  int64_t count = 0;
  for (const auto& parameter : module.parameters(/*recurse=*/true))
    if (seen.insert(parameter.unsafeGetTensorImpl()).second) count += parameter.numel();
  return count;
}

}  // namespace dtrain::models
