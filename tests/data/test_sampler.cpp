// DistributedSampler (include/dtrain/data.h): which samples each step and
// each rank get.
#include <dtrain/data.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using dtrain::data::DistributedSampler;
using dtrain::data::SamplerOptions;

SamplerOptions options(int64_t n, int64_t b, int world = 1, int rank = 0, uint64_t seed = 0, bool shuffle = true) {
  SamplerOptions o;
  o.dataset_size = n;
  o.global_batch_size = b;
  o.world_size = world;
  o.rank = rank;
  o.seed = seed;
  o.shuffle = shuffle;
  return o;
}

// Dataset and batch sizes where B % W varies and batches cross epoch ends.
struct Case {
  int64_t n, b;
};
const std::vector<Case> kCases = {{23, 7}, {10, 4}, {12, 12}, {100, 9}};

TEST(Sampler, RankPartsAreDisjointAndFormTheGlobalBatchInRankOrder) {
  for (bool shuffle : {true, false})
    for (auto [n, b] : kCases)
      for (int world = 1; world <= 4; ++world) {
        if (b < world) continue;
        for (int64_t step = 0; step < 3 * n / b + 2; ++step) {
          DistributedSampler reference(options(n, b, 1, 0, 5, shuffle));
          const auto global = reference.global_batch(step);
          ASSERT_EQ(static_cast<int64_t>(global.size()), b);
          std::vector<int64_t> joined;
          for (int rank = 0; rank < world; ++rank) {
            DistributedSampler sampler(options(n, b, world, rank, 5, shuffle));
            EXPECT_EQ(sampler.global_batch(step), global) << "world " << world << " rank " << rank << " step " << step;
            const auto local = sampler.local_batch(step);
            // The shard rule: the first B % W ranks hold one sample more.
            EXPECT_EQ(static_cast<int64_t>(local.size()), b / world + (rank < b % world ? 1 : 0));
            EXPECT_EQ(static_cast<int64_t>(local.size()), sampler.local_batch_size());
            joined.insert(joined.end(), local.begin(), local.end());
          }
          // Concatenated in rank order the parts are the global batch: every
          // position once, so they are disjoint and complete.
          EXPECT_EQ(joined, global) << "n " << n << " b " << b << " world " << world << " step " << step;
        }
      }
}

TEST(Sampler, EachEpochServesEverySampleOnce) {
  for (bool shuffle : {true, false})
    for (auto [n, b] : kCases) {
      DistributedSampler sampler(options(n, b, 1, 0, 11, shuffle));
      // The stream of global batches is the concatenation of epoch orders.
      std::vector<int64_t> stream;
      for (int64_t step = 0; step < sampler.steps_for_epochs(3); ++step) {
        const auto batch = sampler.global_batch(step);
        stream.insert(stream.end(), batch.begin(), batch.end());
      }
      ASSERT_GE(static_cast<int64_t>(stream.size()), 3 * n);
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        const auto order = sampler.epoch_order(epoch);
        EXPECT_TRUE(std::equal(order.begin(), order.end(), stream.begin() + epoch * n)) << "epoch " << epoch;
        std::vector<int64_t> sorted = order, all(static_cast<size_t>(n));
        std::sort(sorted.begin(), sorted.end());
        std::iota(all.begin(), all.end(), 0);
        EXPECT_EQ(sorted, all) << "epoch " << epoch << " is not a permutation";
      }
    }
}

TEST(Sampler, BatchCrossingAnEpochEndTakesTheEndOfOneAndTheStartOfTheNext) {
  DistributedSampler sampler(options(10, 4, 1, 0, 3));
  const auto first = sampler.epoch_order(0), second = sampler.epoch_order(1);
  // Positions 8..11: the last two of epoch 0, the first two of epoch 1.
  EXPECT_EQ(sampler.global_batch(2), (std::vector<int64_t>{first[8], first[9], second[0], second[1]}));
  EXPECT_EQ(sampler.epoch_of_step(2), 0);
  EXPECT_EQ(sampler.epoch_of_step(3), 1);   // positions 12..15
  EXPECT_EQ(sampler.epoch_of_step(5), 2);   // positions 20..23
  EXPECT_EQ(sampler.steps_for_epochs(1), 3);
  EXPECT_EQ(sampler.steps_for_epochs(2), 5);
  EXPECT_EQ(sampler.steps_for_epochs(0), 0);
}

TEST(Sampler, WithoutShuffleBatchesAreConsecutiveAndWrap) {
  DistributedSampler sampler(options(10, 4, 1, 0, 99, false));
  EXPECT_EQ(sampler.global_batch(0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(sampler.global_batch(1), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(sampler.global_batch(2), (std::vector<int64_t>{8, 9, 0, 1}));
  EXPECT_EQ(sampler.global_batch(7), (std::vector<int64_t>{8, 9, 0, 1}));  // positions 28..31
  DistributedSampler rank1(options(10, 4, 3, 1, 99, false));                // parts 2 + 1 + 1
  EXPECT_EQ(rank1.local_batch(1), (std::vector<int64_t>{6}));
}

TEST(Sampler, ShuffleIsReproducibleFromTheSeedAndDiffersAcrossSeedsAndEpochs) {
  const int64_t n = 1000;
  DistributedSampler a(options(n, 10, 1, 0, 42)), b(options(n, 10, 1, 0, 42)), c(options(n, 10, 1, 0, 43));
  EXPECT_EQ(a.epoch_order(0), b.epoch_order(0));
  EXPECT_EQ(a.epoch_order(5), b.epoch_order(5));
  EXPECT_EQ(a.global_batch(123), b.global_batch(123));
  EXPECT_NE(a.epoch_order(0), c.epoch_order(0));
  EXPECT_NE(a.epoch_order(0), a.epoch_order(1));
  std::vector<int64_t> identity(n);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(a.epoch_order(0), identity);
  // Asking out of order (the cache keeps two epochs) changes nothing.
  const auto epoch3 = a.epoch_order(3);
  a.epoch_order(0);
  a.epoch_order(9);
  EXPECT_EQ(a.epoch_order(3), epoch3);
}

// The permutation is defined by the standard's mt19937_64 and seed_seq and
// our own Fisher-Yates: these values hold on every platform. A change here
// changes every training run's data order.
TEST(Sampler, PermutationIsPinned) {
  DistributedSampler sampler(options(10, 1, 1, 0, 1234));
  EXPECT_EQ(sampler.epoch_order(0), (std::vector<int64_t>{3, 1, 6, 5, 8, 4, 7, 0, 2, 9}));
  EXPECT_EQ(sampler.epoch_order(1), (std::vector<int64_t>{2, 5, 4, 9, 6, 3, 0, 8, 7, 1}));
}

TEST(Sampler, RejectsBadOptions) {
  auto message = [](const SamplerOptions& o) {
    try {
      DistributedSampler sampler(o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(options(10, 11)).find("global batch size 11 is larger than the dataset (10 samples)"),
            std::string::npos);
  EXPECT_NE(message(options(10, 3, 4)).find("global batch size 3 cannot give each of 4 ranks a sample"),
            std::string::npos);
  EXPECT_NE(message(options(10, 4, 2, 2)).find("rank 2 is not in a world of 2"), std::string::npos);
  EXPECT_NE(message(options(0, 1)).find("the dataset is empty"), std::string::npos);
  EXPECT_NE(message(options(10, 0)).find("global batch size must be positive"), std::string::npos);
}

}  // namespace
