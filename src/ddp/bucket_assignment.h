// Which parameters share a gradient bucket.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace dtrain::detail {

// Buckets of parameter indices, in the order they are launched. Parameters
// are taken in reverse registration order (roughly the order backward
// produces their gradients); a bucket holds one dtype on one device and is
// closed when the next parameter would take it over its cap (the first
// bucket has its own, smaller cap so communication starts early). A
// parameter larger than the cap gets a bucket of its own. Deterministic, so
// identical on every rank holding the same model.
std::vector<std::vector<int>> assign_buckets(const std::vector<torch::Tensor>& parameters, int64_t bucket_cap_bytes,
                                             int64_t first_bucket_cap_bytes);

}  // namespace dtrain::detail
