#include "data/batch_index.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dtrain::data {

torch::Tensor batch_index(const std::vector<int64_t>& indices, int64_t size, const char* dataset) {
  for (int64_t index : indices)
    if (index < 0 || index >= size)
      throw std::out_of_range(std::string(dataset) + "::get_batch: index " + std::to_string(index) +
                              " outside [0, " + std::to_string(size) + ")");
  auto index = torch::empty({static_cast<int64_t>(indices.size())}, torch::kLong);
  std::copy(indices.begin(), indices.end(), index.data_ptr<int64_t>());
  return index;
}

}  // namespace dtrain::data
