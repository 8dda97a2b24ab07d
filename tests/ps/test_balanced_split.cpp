// Heterogeneity-aware batch sizes (include/dtrain/data.h):
// split_batch_by_throughput and the sampler's explicit local sizes.
#include <dtrain/data.h>

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

namespace {

using dtrain::data::DistributedSampler;
using dtrain::data::SamplerOptions;
using dtrain::data::split_batch_by_throughput;

int64_t sum(const std::vector<int64_t>& counts) { return std::accumulate(counts.begin(), counts.end(), int64_t{0}); }

TEST(BalancedSplit, ProportionalToThroughput) {
  EXPECT_EQ(split_batch_by_throughput(12, {1, 1, 1}), (std::vector<int64_t>{4, 4, 4}));
  EXPECT_EQ(split_batch_by_throughput(12, {1, 2, 3}), (std::vector<int64_t>{2, 4, 6}));
  // A rank twice as slow gets half the samples of each fast one.
  EXPECT_EQ(split_batch_by_throughput(70, {2, 2, 2, 1}), (std::vector<int64_t>{20, 20, 20, 10}));
}

TEST(BalancedSplit, EveryRankAtLeastOneSampleAndSumExact) {
  std::mt19937 generator(5);
  std::uniform_real_distribution<double> rate(0.01, 1000.0);
  for (int trial = 0; trial < 500; ++trial) {
    const auto ranks = static_cast<int64_t>(1 + trial % 7);
    std::vector<double> throughputs;
    for (int64_t r = 0; r < ranks; ++r) throughputs.push_back(trial % 5 == 0 && r == 0 ? 1e-6 : rate(generator));
    const int64_t batch = ranks + trial % 97;
    const auto counts = split_batch_by_throughput(batch, throughputs);
    ASSERT_EQ(static_cast<int64_t>(counts.size()), ranks);
    EXPECT_EQ(sum(counts), batch) << "trial " << trial;
    const double total_rate = std::accumulate(throughputs.begin(), throughputs.end(), 0.0);
    bool every_share_at_least_one = true;
    for (int64_t r = 0; r < ranks; ++r)
      every_share_at_least_one &= static_cast<double>(batch) * throughputs[r] / total_rate >= 1;
    for (int64_t r = 0; r < ranks; ++r) {
      EXPECT_GE(counts[r], 1) << "trial " << trial << " rank " << r;
      // Within one sample of the proportional share (unless a tiny share
      // had to be raised to one sample).
      const double share = static_cast<double>(batch) * throughputs[r] / total_rate;
      if (every_share_at_least_one) {
        EXPECT_LT(std::abs(static_cast<double>(counts[r]) - share), 1.0) << "trial " << trial << " rank " << r;
      }
    }
    EXPECT_EQ(split_batch_by_throughput(batch, throughputs), counts) << "deterministic";
  }
}

TEST(BalancedSplit, TinySharesStillGetOneSample) {
  EXPECT_EQ(split_batch_by_throughput(10, {1e-6, 1, 1e-6}), (std::vector<int64_t>{1, 8, 1}));
}

TEST(BalancedSplit, TiesGoToTheLowerRank) {
  EXPECT_EQ(split_batch_by_throughput(5, {1, 1}), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(split_batch_by_throughput(7, {1, 1, 1}), (std::vector<int64_t>{3, 2, 2}));
}

TEST(BalancedSplit, RejectsBadInput) {
  EXPECT_THROW(split_batch_by_throughput(4, {}), std::invalid_argument);
  EXPECT_THROW(split_batch_by_throughput(4, {1, 0}), std::invalid_argument);
  EXPECT_THROW(split_batch_by_throughput(4, {1, -2}), std::invalid_argument);
  EXPECT_THROW(split_batch_by_throughput(4, {1, NAN}), std::invalid_argument);
  EXPECT_THROW(split_batch_by_throughput(2, {1, 1, 1}), std::invalid_argument);
}

SamplerOptions sampler_options(int rank, std::vector<int64_t> sizes) {
  SamplerOptions o;
  o.dataset_size = 50;
  o.global_batch_size = 12;
  o.world_size = static_cast<int>(sizes.size());
  o.rank = rank;
  o.seed = 3;
  o.local_batch_sizes = std::move(sizes);
  return o;
}

TEST(BalancedSplit, SamplerPartsFollowTheSizesAndFormTheSameGlobalBatch) {
  const std::vector<int64_t> sizes{2, 7, 3};
  SamplerOptions even = sampler_options(0, {});
  even.world_size = 3;
  const DistributedSampler reference(even);
  for (int64_t step = 0; step < 9; ++step) {  // crosses epoch ends (12 * 9 > 2 * 50)
    std::vector<int64_t> joined;
    for (int rank = 0; rank < 3; ++rank) {
      const DistributedSampler sampler(sampler_options(rank, sizes));
      const auto local = sampler.local_batch(step);
      EXPECT_EQ(static_cast<int64_t>(local.size()), sizes[static_cast<size_t>(rank)]);
      EXPECT_EQ(sampler.local_batch_size(), sizes[static_cast<size_t>(rank)]);
      joined.insert(joined.end(), local.begin(), local.end());
    }
    EXPECT_EQ(joined, reference.global_batch(step)) << "step " << step;
  }
}

TEST(BalancedSplit, SamplerRejectsBadSizes) {
  EXPECT_THROW(DistributedSampler(sampler_options(0, {6, 7})), std::invalid_argument);      // sum 13
  EXPECT_THROW(DistributedSampler(sampler_options(0, {12, 0})), std::invalid_argument);     // a zero
  SamplerOptions wrong_count = sampler_options(0, {6, 6});
  wrong_count.world_size = 3;
  EXPECT_THROW(DistributedSampler{wrong_count}, std::invalid_argument);
}

}  // namespace
