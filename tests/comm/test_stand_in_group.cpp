// dtrain::stand_in_group (include/dtrain/stand_in_group.h): rank r of a group
// of n that exists in one process. Every collective gives the shapes the real
// group gives, with this rank's data in its place, and the traffic is counted.
#include "dtrain/stand_in_group.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

namespace {

TEST(StandInGroup, CollectivesKeepShapesAndPlaceThisRanksData) {
  auto traffic = std::make_shared<dtrain::StandInTraffic>();
  const dtrain::CommPtr group = dtrain::stand_in_group(4, 2, traffic);
  EXPECT_EQ(group->size(), 4);
  EXPECT_EQ(group->rank(), 2);

  auto summed = torch::full({3}, 5.0f);
  group->all_reduce(summed)->wait();
  EXPECT_TRUE(summed.equal(torch::full({3}, 5.0f)));  // the peers are imagined: nothing added

  const auto piece = torch::tensor({1.0f, 2.0f});
  auto full = torch::full({8}, 9.0f);
  group->all_gather(piece, full)->wait();
  EXPECT_TRUE(full.equal(torch::tensor({0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 2.0f, 0.0f, 0.0f})));

  auto mine = torch::zeros({2});
  group->reduce_scatter(torch::arange(8, torch::kFloat), mine)->wait();
  EXPECT_TRUE(mine.equal(torch::tensor({4.0f, 5.0f})));

  EXPECT_EQ(traffic->operations["all_reduce"].calls, 1);
  EXPECT_EQ(traffic->operations["all_reduce"].payload_bytes, 12);
  EXPECT_EQ(traffic->operations["all_gather"].payload_bytes, 32);
  EXPECT_EQ(traffic->operations["reduce_scatter"].payload_bytes, 32);
}

TEST(StandInGroup, HasNoPeersAndChecksItsRank) {
  const dtrain::CommPtr group = dtrain::stand_in_group(2, 0);
  auto t = torch::zeros({1});
  EXPECT_THROW(group->send(t, 1, 0)->wait(), dtrain::CommError);
  EXPECT_THROW(dtrain::stand_in_group(2, 2), std::invalid_argument);
  EXPECT_THROW(dtrain::stand_in_group(0, 0), std::invalid_argument);
}

}  // namespace
