// Staleness statistics of the parameter server (include/dtrain/ps.h).
#include "dtrain/ps.h"

#include <algorithm>

namespace dtrain::ps {

int64_t ServerReport::max_staleness() const {
  int64_t most = 0;
  for (const auto& record : records) most = std::max(most, record.staleness);
  return most;
}

double ServerReport::mean_staleness() const {
  if (records.empty()) return 0;
  double sum = 0;
  for (const auto& record : records) sum += static_cast<double>(record.staleness);
  return sum / static_cast<double>(records.size());
}

Summary summarize(const Group& group, const ServerReport* report) {
  // [records, staleness sum] summed; [max staleness, dropped, max clock lead] maxed.
  auto sums = torch::zeros({2}, torch::kFloat64);
  auto maxima = torch::zeros({3}, torch::kFloat64);
  if (report) {
    sums[0] = static_cast<double>(report->records.size());
    sums[1] = report->mean_staleness() * static_cast<double>(report->records.size());
    maxima[0] = static_cast<double>(report->max_staleness());
    maxima[1] = static_cast<double>(report->dropped);
    int64_t lead = 0;
    for (const auto& record : report->records) lead = std::max(lead, record.clock_lead);
    maxima[2] = static_cast<double>(lead);
  }
  group.world()->blocking().all_reduce(sums, ReduceOp::Sum);
  group.world()->blocking().all_reduce(maxima, ReduceOp::Max);
  Summary summary;
  summary.updates = static_cast<int64_t>(sums[0].item<double>());
  summary.mean_staleness = summary.updates > 0 ? sums[1].item<double>() / static_cast<double>(summary.updates) : 0;
  summary.max_staleness = static_cast<int64_t>(maxima[0].item<double>());
  summary.dropped = static_cast<int64_t>(maxima[1].item<double>());
  summary.max_clock_lead = static_cast<int64_t>(maxima[2].item<double>());
  return summary;
}

}  // namespace dtrain::ps
