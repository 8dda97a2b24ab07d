// Internal: the indices of Dataset::get_batch as a tensor, checked.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace dtrain::data {

// int64 [indices.size()] tensor of `indices`; throws std::out_of_range,
// naming `dataset` and the index, for one outside [0, size).
torch::Tensor batch_index(const std::vector<int64_t>& indices, int64_t size, const char* dataset);

}  // namespace dtrain::data
