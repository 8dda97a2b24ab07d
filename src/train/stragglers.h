// --slow-rank and --balance (issue 7): a deliberate straggler, and the
// heterogeneity-aware re-split of the global batch that copes with one.
//
// Both work on the time a rank spends in forward and backward ("compute"),
// which excludes waiting for other ranks: a straggler's compute is longer,
// but everyone's step time is the same in synchronous training.
#pragma once

#include "dtrain/comm.h"
#include "dtrain/train.h"

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

namespace dtrain::train {

// --balance measures steps 2..kBalanceAfterSteps (step 1 warms up caches and
// allocators) and re-splits after step kBalanceAfterSteps. Steps of a small
// model last a millisecond or two, and one late wake-up on a busy machine
// costs as much: 19 steps make the measured split steady (4 did not).
inline constexpr int64_t kBalanceAfterSteps = 20;

class Stragglers {
 public:
  // `rank`: this rank in the world (what --slow-rank names); `part`: its index
  // among the ranks that share the batch (workers), `parts` their number.
  Stragglers(const TrainConfig& config, int rank, int part, int parts);

  // Around forward + backward of a step with `local_samples` samples, of
  // which `waited_s` were spent waiting for other ranks (not compute).
  // On the --slow-rank rank, begin() first sleeps (FACTOR - 1) x the CPU time
  // the previous step's forward and backward took on this thread (CPU time,
  // not wall time: on a machine whose ranks share cores, time spent waiting
  // for a core would otherwise lengthen the next delay, and that the next,
  // and the straggler would end up far slower than FACTOR; intra-op threads
  // other than this one are not counted). The sleep comes before the step's first
  // collective, so it overlaps the other ranks' compute as a slower machine
  // would; sleeping after backward, once the gradients are synchronised,
  // would add the delay to everyone's step whatever the split, and --balance
  // could then gain nothing.
  void begin();
  void end(int64_t local_samples, double waited_s = 0);

  // After step `done` (1-based): with --balance, at done == kBalanceAfterSteps,
  // all-gathers every part's samples/s over `comm` (collective: every part
  // calls it after every step) and returns the new local batch sizes
  // (data::split_batch_by_throughput); otherwise nothing.
  std::optional<std::vector<int64_t>> rebalance(int64_t done, Communicator& comm);

  // The split in force: empty until a rebalance (the even split).
  const std::vector<int64_t>& local_batch_sizes() const { return sizes_; }

 private:
  using Clock = std::chrono::steady_clock;
  bool slow_ = false;
  double slow_factor_ = 1;
  bool balance_ = false;
  int part_ = 0;
  int parts_ = 1;
  int64_t global_batch_ = 0;
  int64_t steps_seen_ = 0;
  Clock::time_point started_;
  double cpu_started_s_ = 0;    // this thread's CPU time at begin(), after the delay
  double last_compute_s_ = 0;   // the previous step's CPU time, which sets the next delay
  double measured_seconds_ = 0;  // steps 2..kBalanceAfterSteps
  int64_t measured_samples_ = 0;
  std::vector<int64_t> sizes_;
};

// "a | b | c" for the summary line.
std::string format_split(const std::vector<int64_t>& sizes);

}  // namespace dtrain::train
