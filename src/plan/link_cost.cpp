// The α-β cost of the plan's collectives (include/dtrain/plan.h, Link): the
// first part of a step's predicted time (issue 40).
//
// Note [link cost]
// A message of n bytes over a link takes α + n / β: α the latency of one
// hop, β the bandwidth. A ring collective over G ranks takes G - 1 hops
// (all-gather, reduce-scatter, all-to-all, broadcast) or 2 (G - 1)
// (all-reduce: a reduce-scatter, then an all-gather), and each rank sends
// its wire bytes (collectives.cpp: (G - 1)/G of the payload, twice that for
// all-reduce, all of it for a send), so a Collective of `calls` calls takes
// calls x hops x α + wire_bytes / β. A send is one hop. The fit of α and β to
// measured times is least squares of t = α + n / β over the message sizes,
// in relative error (the model's two parameters are linear in 1 and n).
#include "dtrain/plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::plan {

int64_t latency_hops(const std::string& op, int group_size) {
  if (op == "send") return 1;
  if (group_size <= 1) return 0;
  const int64_t ring = group_size - 1;
  if (op == "all_reduce") return 2 * ring;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all" || op == "broadcast") return ring;
  throw std::invalid_argument("plan: no latency model for the collective '" + op + "'");
}

double collective_seconds(const Collective& c, const Link& link) {
  if (!(link.latency_seconds >= 0) || !(link.bytes_per_second > 0))
    throw std::invalid_argument("plan: a link needs latency >= 0 and bandwidth > 0 (got " +
                                std::to_string(link.latency_seconds) + " s, " + std::to_string(link.bytes_per_second) +
                                " B/s)");
  return static_cast<double>(c.calls * latency_hops(c.op, c.group_size)) * link.latency_seconds +
         static_cast<double>(c.wire_bytes) / link.bytes_per_second;
}

Link fit_link(const std::vector<std::pair<int64_t, double>>& bytes_and_seconds) {
  // Weighted least squares with weights 1 / t^2: the sizes span decades, and
  // an unweighted fit would leave the latency to the largest messages' noise.
  double w = 0, wn = 0, wnn = 0, wt = 0, wnt = 0;
  for (const auto& [bytes, seconds] : bytes_and_seconds) {
    if (!(seconds > 0))
      throw std::invalid_argument("plan: a measured time must be positive, got " + std::to_string(seconds));
    const double weight = 1.0 / (seconds * seconds), n = static_cast<double>(bytes);
    w += weight;
    wn += weight * n;
    wnn += weight * n * n;
    wt += weight * seconds;
    wnt += weight * n * seconds;
  }
  const double determinant = w * wnn - wn * wn;
  if (bytes_and_seconds.size() < 2 || !(determinant > 0))
    throw std::invalid_argument("plan: fitting a link needs messages of at least two sizes");
  const double per_byte = (w * wnt - wn * wt) / determinant;
  if (!(per_byte > 0))
    throw std::invalid_argument("plan: the measured times do not grow with the message size; no bandwidth to fit");
  // A negative intercept (noise at small sizes) is no latency at all.
  return {std::max(0.0, (wt - per_byte * wn) / w), 1.0 / per_byte};
}

}  // namespace dtrain::plan
