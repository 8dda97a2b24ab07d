// DDP's gradient buckets: one flat buffer per bucket, one slot (a
// same-shaped alias of part of the buffer) per parameter, built from an
// assignment (bucket_assignment.h) and rebuilt with gradients carried over.
#pragma once

#include <dtrain/comm_hooks.h>

#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::detail {

struct Bucket {
  GradBucket grads;          // buffer, slots (grads.gradients), names; index = launch position
  std::vector<int> members;  // parameter indices, in slot order
  int missing = 0;           // members whose gradient is not in yet
  // Per member: a gradient that is not its slot, to be copied in once the
  // bucket is complete (one fused copy, gradient_copy.h); undefined = none.
  std::vector<torch::Tensor> staged;
  int staged_count = 0;
  std::unique_ptr<PendingReduction> reduction;
};

struct Slot {
  int bucket = 0;
  int position = 0;  // index within the bucket's members
};

struct BucketSet {
  std::vector<Bucket> buckets;
  std::vector<Slot> slots;  // per parameter

  torch::Tensor& slot(int parameter) {
    const auto& s = slots[parameter];
    return buckets[s.bucket].grads.gradients[s.position];
  }
  std::vector<std::vector<int>> assignment() const;
};

// Zeroed buckets for `assignment` (launch order, members in slot order),
// in the parameters' dtype or, when given, in `dtype` (DDP's reduce_dtype).
BucketSet build_buckets(const std::vector<std::vector<int>>& assignment, const std::vector<torch::Tensor>& parameters,
                        const std::vector<std::string>& names, std::optional<c10::ScalarType> dtype = std::nullopt);

// Moves every slot's contents from `from` into `to` and re-points each
// gradient that was a view of its old slot to its new one, so a rebuild is
// invisible to the user (gradients held across it keep their values and
// stay views).
void carry_over(BucketSet& from, BucketSet& to, std::vector<torch::Tensor>& parameters);

// `grad` is exactly `slot` (same memory, shape and strides).
bool is_view_of(const torch::Tensor& grad, const torch::Tensor& slot);

}  // namespace dtrain::detail
