#include "ddp/bucket_assignment.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>

namespace dtrain::detail {

std::vector<int> reverse_registration_order(size_t parameters) {
  std::vector<int> order(parameters);
  std::iota(order.rbegin(), order.rend(), 0);
  return order;
}

std::vector<std::vector<int>> assign_buckets(const std::vector<torch::Tensor>& parameters,
                                             const std::vector<int>& order, int64_t bucket_cap_bytes,
                                             int64_t first_bucket_cap_bytes) {
  if (order.size() != parameters.size()) throw std::logic_error("assign_buckets: the order is not a permutation");
  std::vector<int> position(parameters.size(), -1);
  for (size_t k = 0; k < order.size(); ++k) {
    const int p = order[k];
    if (p < 0 || static_cast<size_t>(p) >= parameters.size() || position[p] != -1) {
      throw std::logic_error("assign_buckets: the order is not a permutation");
    }
    position[p] = static_cast<int>(k);
  }

  struct OpenBucket {
    std::vector<int> members;
    int64_t bytes = 0;
  };
  // One open bucket per dtype and device, since a bucket is one flat tensor.
  std::map<std::string, OpenBucket> open;
  std::vector<std::vector<int>> closed;
  auto cap = [&] { return closed.empty() ? first_bucket_cap_bytes : bucket_cap_bytes; };

  for (int i : order) {
    const auto& p = parameters[i];
    const std::string key = std::to_string(static_cast<int>(p.scalar_type())) + "@" + p.device().str();
    auto& bucket = open[key];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    if (!bucket.members.empty() && bucket.bytes + bytes > cap()) {
      closed.push_back(std::move(bucket.members));
      bucket = OpenBucket{};
    }
    bucket.members.push_back(i);
    bucket.bytes += bytes;
    if (bucket.bytes >= cap()) {
      closed.push_back(std::move(bucket.members));
      bucket = OpenBucket{};
    }
  }
  for (auto& [key, bucket] : open) {
    if (!bucket.members.empty()) closed.push_back(std::move(bucket.members));
  }
  // Launch order follows the expected gradient order: by each bucket's
  // first member, across dtypes.
  std::sort(closed.begin(), closed.end(), [&](const std::vector<int>& a, const std::vector<int>& b) {
    return position[a.front()] < position[b.front()];
  });
  return closed;
}

}  // namespace dtrain::detail
