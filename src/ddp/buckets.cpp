#include "ddp/buckets.h"

#include "common/tensor_alias.h"

#include <torch/utils.h>

namespace dtrain::detail {

std::vector<std::vector<int>> BucketSet::assignment() const {
  std::vector<std::vector<int>> members;
  for (const auto& bucket : buckets) members.push_back(bucket.members);
  return members;
}

BucketSet build_buckets(const std::vector<std::vector<int>>& assignment, const std::vector<torch::Tensor>& parameters,
                        const std::vector<std::string>& names, std::optional<c10::ScalarType> dtype) {
  BucketSet set;
  set.slots.resize(parameters.size());
  for (const auto& members : assignment) {
    Bucket bucket;
    bucket.grads.index = static_cast<int>(set.buckets.size());
    int64_t total = 0;
    for (int p : members) total += parameters[p].numel();
    auto options = parameters[members.front()].options().requires_grad(false);
    if (dtype) options = options.dtype(*dtype);
    bucket.grads.buffer = torch::zeros({total}, options);
    int64_t offset = 0;
    for (size_t position = 0; position < members.size(); ++position) {
      const auto& param = parameters[members[position]];
      bucket.grads.gradients.push_back(alias_of(bucket.grads.buffer, offset, param.sizes()));
      bucket.grads.names.push_back(names[members[position]]);
      set.slots[members[position]] = Slot{bucket.grads.index, static_cast<int>(position)};
      offset += param.numel();
    }
    bucket.members = members;
    bucket.staged.resize(members.size());
    set.buckets.push_back(std::move(bucket));
  }
  return set;
}

void carry_over(BucketSet& from, BucketSet& to, std::vector<torch::Tensor>& parameters) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const int p = static_cast<int>(i);
    auto& old_slot = from.slot(p);
    auto& new_slot = to.slot(p);
    new_slot.copy_(old_slot);
    auto& grad = parameters[i].mutable_grad();
    if (is_view_of(grad, old_slot)) grad = new_slot;
  }
}

bool is_view_of(const torch::Tensor& grad, const torch::Tensor& slot) {
  return grad.defined() && grad.data_ptr() == slot.data_ptr() && grad.sizes() == slot.sizes() &&
         grad.strides() == slot.strides();
}

}  // namespace dtrain::detail
