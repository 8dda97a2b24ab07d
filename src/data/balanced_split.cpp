// split_batch_by_throughput (include/dtrain/data.h): heterogeneity-aware
// local batch sizes.
#include "dtrain/data.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace dtrain::data {

std::vector<int64_t> split_batch_by_throughput(int64_t global_batch, const std::vector<double>& throughputs) {
  const auto ranks = static_cast<int64_t>(throughputs.size());
  if (ranks == 0) throw std::invalid_argument("split_batch_by_throughput: no throughputs given (one per rank)");
  for (size_t r = 0; r < throughputs.size(); ++r)
    if (!std::isfinite(throughputs[r]) || throughputs[r] <= 0)
      throw std::invalid_argument("split_batch_by_throughput: rank " + std::to_string(r) + "'s throughput is " +
                                  std::to_string(throughputs[r]) + "; measure a positive number of samples per second");
  if (global_batch < ranks)
    throw std::invalid_argument("split_batch_by_throughput: a global batch of " + std::to_string(global_batch) +
                                " cannot give each of " + std::to_string(ranks) + " ranks a sample");

  // Shares of the whole batch in proportion to throughput, rounded down;
  // the samples left by rounding go to the largest remainders (the lower rank
  // on a tie). A rank whose share rounds to 0 then takes one sample from the
  // rank with the most (the lowest such rank), so every rank computes.
  const double total_rate = std::accumulate(throughputs.begin(), throughputs.end(), 0.0);
  std::vector<int64_t> counts(throughputs.size(), 0);
  std::vector<double> remainders(throughputs.size());
  int64_t given = 0;
  for (size_t r = 0; r < throughputs.size(); ++r) {
    const double exact = static_cast<double>(global_batch) * (throughputs[r] / total_rate);
    counts[r] = std::min<int64_t>(global_batch - given, static_cast<int64_t>(std::floor(exact)));
    given += counts[r];
    remainders[r] = exact - std::floor(exact);
  }
  std::vector<size_t> order(throughputs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return remainders[a] > remainders[b]; });
  for (size_t i = 0; given < global_batch; i = (i + 1) % order.size(), ++given) ++counts[order[i]];
  for (auto& count : counts) {
    if (count > 0) continue;
    --*std::max_element(counts.begin(), counts.end());
    count = 1;
  }
  return counts;
}

}  // namespace dtrain::data
