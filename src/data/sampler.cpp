#include "dtrain/data.h"

#include "dtrain/shard_range.h"

#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

namespace dtrain::data {

namespace {

// Uniform in [0, bound) by rejection: unbiased, and unlike
// std::uniform_int_distribution its algorithm is ours, so every standard
// library gives the same permutation.
uint64_t uniform_below(std::mt19937_64& generator, uint64_t bound) {
  const uint64_t limit = std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % bound;
  uint64_t r;
  do r = generator();
  while (r >= limit);
  return r % bound;
}

std::vector<int64_t> make_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle) return order;
  // std::seed_seq and mt19937_64 are specified exactly by the standard.
  const auto e = static_cast<uint64_t>(epoch);
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(e),
                    static_cast<uint32_t>(e >> 32)};
  std::mt19937_64 generator(seq);
  for (int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates
    const auto j = static_cast<int64_t>(uniform_below(generator, static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

void check_options(const SamplerOptions& o) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("DistributedSampler: " + what); };
  if (o.dataset_size <= 0) fail("the dataset is empty (dataset_size " + std::to_string(o.dataset_size) + ")");
  if (o.world_size <= 0 || o.rank < 0 || o.rank >= o.world_size)
    fail("rank " + std::to_string(o.rank) + " is not in a world of " + std::to_string(o.world_size));
  if (o.global_batch_size <= 0)
    fail("global batch size must be positive, got " + std::to_string(o.global_batch_size));
  if (o.global_batch_size > o.dataset_size)
    fail("global batch size " + std::to_string(o.global_batch_size) + " is larger than the dataset (" +
         std::to_string(o.dataset_size) + " samples)");
  if (o.global_batch_size < o.world_size)
    fail("global batch size " + std::to_string(o.global_batch_size) + " cannot give each of " +
         std::to_string(o.world_size) + " ranks a sample: use a global batch of at least the world size");
  if (o.local_batch_sizes.empty()) return;
  if (static_cast<int64_t>(o.local_batch_sizes.size()) != o.world_size)
    fail("local_batch_sizes has " + std::to_string(o.local_batch_sizes.size()) + " entries for " +
         std::to_string(o.world_size) + " ranks: give one size per rank (or none for the even split)");
  int64_t sum = 0;
  for (size_t r = 0; r < o.local_batch_sizes.size(); ++r) {
    if (o.local_batch_sizes[r] < 1)
      fail("local batch size of rank " + std::to_string(r) + " is " + std::to_string(o.local_batch_sizes[r]) +
           ": every rank needs at least one sample");
    sum += o.local_batch_sizes[r];
  }
  if (sum != o.global_batch_size)
    fail("local_batch_sizes sum to " + std::to_string(sum) + " but the global batch size is " +
         std::to_string(o.global_batch_size) + " (use data::split_batch_by_throughput)");
}

// Rank `rank`'s contiguous part of the global batch (see DistributedSampler).
ShardRange local_part(const SamplerOptions& o) {
  if (o.local_batch_sizes.empty()) return shard_range(o.global_batch_size, o.world_size, o.rank);
  ShardRange part;
  for (int r = 0; r < o.rank; ++r) part.offset += o.local_batch_sizes[static_cast<size_t>(r)];
  part.count = o.local_batch_sizes[static_cast<size_t>(o.rank)];
  return part;
}

}  // namespace

DistributedSampler::DistributedSampler(const SamplerOptions& options) : options_(options) { check_options(options_); }

const std::vector<int64_t>& DistributedSampler::cached_order(int64_t epoch) const {
  auto found = orders_.find(epoch);
  if (found != orders_.end()) return found->second;
  // A batch needs at most two epochs (B <= N) and training moves forward, so
  // the two most recent are all worth keeping.
  while (orders_.size() >= 2) orders_.erase(orders_.begin());
  return orders_.emplace(epoch, make_order(options_.dataset_size, options_.shuffle, options_.seed, epoch)).first->second;
}

std::vector<int64_t> DistributedSampler::global_batch(int64_t step) const {
  if (step < 0) throw std::invalid_argument("DistributedSampler: step must be >= 0, got " + std::to_string(step));
  const int64_t n = options_.dataset_size, b = options_.global_batch_size;
  std::vector<int64_t> batch;
  batch.reserve(static_cast<size_t>(b));
  std::lock_guard<std::mutex> lock(mutex_);
  // Positions [step*B, (step+1)*B) of the stream of epoch orders.
  for (int64_t position = step * b; position < (step + 1) * b; ++position)
    batch.push_back(cached_order(position / n)[static_cast<size_t>(position % n)]);
  return batch;
}

std::vector<int64_t> DistributedSampler::local_batch(int64_t step) const {
  const auto global = global_batch(step);
  const auto part = local_part(options_);
  return {global.begin() + part.offset, global.begin() + part.offset + part.count};
}

int64_t DistributedSampler::local_batch_size() const {
  return local_part(options_).count;
}

int64_t DistributedSampler::epoch_of_step(int64_t step) const {
  if (step < 0) throw std::invalid_argument("DistributedSampler: step must be >= 0, got " + std::to_string(step));
  return step * options_.global_batch_size / options_.dataset_size;
}

int64_t DistributedSampler::steps_for_epochs(int64_t epochs) const {
  if (epochs < 0) throw std::invalid_argument("DistributedSampler: epochs must be >= 0, got " + std::to_string(epochs));
  const int64_t samples = epochs * options_.dataset_size;
  return (samples + options_.global_batch_size - 1) / options_.global_batch_size;
}

std::vector<int64_t> DistributedSampler::epoch_order(int64_t epoch) const {
  if (epoch < 0) throw std::invalid_argument("DistributedSampler: epoch must be >= 0, got " + std::to_string(epoch));
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_order(epoch);
}

}  // namespace dtrain::data
