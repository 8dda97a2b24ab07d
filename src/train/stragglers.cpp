#include "train/stragglers.h"

#include "dtrain/data.h"

#include <torch/types.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>

#include <time.h>

namespace dtrain::train {

Stragglers::Stragglers(const TrainConfig& config, int rank, int part, int parts)
    : slow_(config.slow_rank == rank && config.slow_factor > 1),
      slow_factor_(config.slow_factor),
      balance_(config.balance),
      part_(part),
      parts_(parts),
      global_batch_(config.batch_size) {}

namespace {

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

}  // namespace

void Stragglers::begin() {
  started_ = Clock::now();
  if (!slow_) return;
  const double delay = (slow_factor_ - 1) * last_compute_s_;
  if (delay > 0) std::this_thread::sleep_for(std::chrono::duration<double>(delay));
  cpu_started_s_ = thread_cpu_seconds();
}

void Stragglers::end(int64_t local_samples, double waited_s) {
  if (slow_) last_compute_s_ = thread_cpu_seconds() - cpu_started_s_;
  // What --balance measures: this rank's wall time in the step, the delay
  // included, less its waits for other ranks.
  const double seconds = std::max(0.0, std::chrono::duration<double>(Clock::now() - started_).count() - waited_s);
  ++steps_seen_;
  if (steps_seen_ >= 2 && steps_seen_ <= kBalanceAfterSteps) {
    measured_seconds_ += seconds;
    measured_samples_ += local_samples;
  }
}

std::optional<std::vector<int64_t>> Stragglers::rebalance(int64_t done, Communicator& comm) {
  if (!balance_ || done != kBalanceAfterSteps) return std::nullopt;
  // Each part writes its own slot; a sum all-reduce is the all-gather.
  auto rates = torch::zeros({parts_}, torch::kFloat64);
  rates[part_] = measured_seconds_ > 0 ? static_cast<double>(measured_samples_) / measured_seconds_ : 1.0;
  comm.blocking().all_reduce(rates, ReduceOp::Sum);
  std::vector<double> throughputs(static_cast<size_t>(parts_));
  for (int p = 0; p < parts_; ++p) throughputs[static_cast<size_t>(p)] = rates[p].item<double>();
  sizes_ = data::split_batch_by_throughput(global_batch_, throughputs);
  return sizes_;
}

}  // namespace dtrain::train

namespace dtrain {

std::pair<int, double> parse_slow_rank(const std::string& text) {
  const auto colon = text.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    size_t used = 0;
    const std::string rank_text = text.substr(0, colon);
    const std::string factor_text = text.substr(colon + 1);
    const int rank = std::stoi(rank_text, &used);
    if (used != rank_text.size() || rank < 0) throw std::invalid_argument("rank");
    const double factor = std::stod(factor_text, &used);
    if (used != factor_text.size()) throw std::invalid_argument("factor");
    return {rank, factor};
  } catch (const std::exception&) {
    throw std::invalid_argument("--slow-rank '" + text + "' is not RANK:FACTOR, e.g. 1:2 (rank 1 twice as slow)");
  }
}

}  // namespace dtrain

namespace dtrain::train {

std::string format_split(const std::vector<int64_t>& sizes) {
  std::string text;
  for (size_t r = 0; r < sizes.size(); ++r) text += (r == 0 ? "" : " | ") + std::to_string(sizes[r]);
  return text;
}

}  // namespace dtrain::train
