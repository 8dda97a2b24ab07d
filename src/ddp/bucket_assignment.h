// Which parameters share a gradient bucket.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace dtrain::detail {

// Reverse registration order: roughly the order backward produces
// gradients, the best guess before a backward pass has been seen.
std::vector<int> reverse_registration_order(size_t parameters);

// Buckets of parameter indices, in the order they are launched. Parameters
// are taken in `order` (a permutation of their indices: the order their
// gradients are expected to become ready); a bucket holds one dtype on one
// device and is closed when the next parameter would take it over its cap
// (the first bucket has its own, smaller cap so communication starts
// early). A parameter larger than the cap gets a bucket of its own. Buckets
// launch in the order of their first member. Deterministic, so identical on
// every rank given the same model and order.
std::vector<std::vector<int>> assign_buckets(const std::vector<torch::Tensor>& parameters,
                                             const std::vector<int>& order, int64_t bucket_cap_bytes,
                                             int64_t first_bucket_cap_bytes);

}  // namespace dtrain::detail
