// Buckets rebuilt in the order gradients arrived in the first synchronised
// backward (DDPOptions::rebuild_buckets): rank 0's order on every rank, the
// same caps, gradients held across the rebuild carried over, and training
// still equal to single-process training.
#include <dtrain/ddp.h>

#include "../common/multirank_gtest.h"
#include "ddp_test_support.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>

namespace {

using dtrain::testing::world;
using dtrain::testing::world_ptr;
using namespace ddp_test;

// Registers its layers in the reverse of the order forward uses them, so
// reverse registration order (the guess before any backward) is the
// opposite of the order backward produces their gradients.
struct ReversedImpl : torch::nn::Module {
  ReversedImpl() {
    last = register_module("last", torch::nn::Linear(32, kClasses));
    middle = register_module("middle", torch::nn::Linear(32, 32));
    first = register_module("first", torch::nn::Linear(kImage * kImage, 32));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return last(torch::relu(middle(torch::relu(first(x.flatten(1))))));
  }
  torch::nn::Linear last{nullptr}, middle{nullptr}, first{nullptr};
};
TORCH_MODULE(Reversed);

// Two branches whose order in forward, and hence in backward, differs
// between ranks: even ranks run `a` first.
struct TwoBranchesImpl : torch::nn::Module {
  TwoBranchesImpl() {
    a = register_module("a", torch::nn::Linear(kImage * kImage, kClasses));
    b = register_module("b", torch::nn::Linear(kImage * kImage, kClasses));
  }
  torch::Tensor forward(const torch::Tensor& x, bool a_first) {
    const auto flat = x.flatten(1);
    if (a_first) {
      auto ya = a(flat);
      return ya + b(flat);
    }
    auto yb = b(flat);
    return a(flat) + yb;
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoBranches);

dtrain::DDPOptions tiny_buckets() {
  dtrain::DDPOptions options;
  options.bucket_cap_bytes = 600;  // about one tensor per bucket
  options.first_bucket_cap_bytes = 200;
  return options;
}

std::vector<std::string> flat(const std::vector<std::vector<std::string>>& layout) {
  std::vector<std::string> names;
  for (const auto& bucket : layout) names.insert(names.end(), bucket.begin(), bucket.end());
  return names;
}

// Every rank holds the same layout: equal hashes of its names, min and max.
bool same_on_all_ranks(const std::vector<std::vector<std::string>>& layout) {
  std::string text;
  for (const auto& bucket : layout) {
    for (const auto& name : bucket) text += name + ",";
    text += "|";
  }
  const auto hash = static_cast<int64_t>(std::hash<std::string>{}(text) >> 1);
  auto low = torch::tensor({hash}, torch::kInt64), high = low.clone();
  world().all_reduce(low, dtrain::ReduceOp::Min)->wait();
  world().all_reduce(high, dtrain::ReduceOp::Max)->wait();
  return low.item<int64_t>() == hash && high.item<int64_t>() == hash;
}

size_t position_of(const std::vector<std::string>& names, const std::string& prefix) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].rfind(prefix, 0) == 0) return i;
  }
  return names.size();
}

// Trains the Reversed model like one process; after step 1 its buckets
// follow backward's order (last, middle, first).
void expect_rebuilt_and_equal(bool set_to_none) {
  auto reference = make_model<Reversed>(17);
  torch::optim::SGD reference_optimizer(reference->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto replica = make_model<Reversed>(17);
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr(), tiny_buckets());
  torch::optim::SGD optimizer(replica->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  const auto before = flat(ddp.bucket_layout());
  EXPECT_LT(position_of(before, "first."), position_of(before, "last.")) << "reverse registration order";
  for (int step = 0; step < 6; ++step) {
    const auto batch = global_batch(step, 12);
    reference_optimizer.zero_grad(set_to_none);
    torch::cross_entropy_loss(reference->forward(batch.inputs), batch.targets).backward();
    const auto mine = local_part(batch, world());
    optimizer.zero_grad(set_to_none);
    torch::cross_entropy_loss(ddp(mine.inputs), mine.targets).backward();
    if (step == 0) {
      // Read after the rebuild: the carried-over gradients are the averages.
      EXPECT_LE(max_abs_difference(gradients_of(replica->parameters()), gradients_of(reference->parameters())),
                1e-6);
    }
    reference_optimizer.step();
    optimizer.step();
  }
  const auto layout = ddp.bucket_layout();
  const auto after = flat(layout);
  EXPECT_LT(position_of(after, "last."), position_of(after, "middle.")) << ::testing::PrintToString(layout);
  EXPECT_LT(position_of(after, "middle."), position_of(after, "first.")) << ::testing::PrintToString(layout);
  EXPECT_TRUE(same_on_all_ranks(layout));
  EXPECT_LE(max_abs_difference(replica->parameters(), reference->parameters()), 1e-5);
  // Gradients are views into the new buckets: as many storages as buckets.
  std::set<const void*> storages;
  for (const auto& p : replica->parameters()) storages.insert(p.grad().storage().data());
  EXPECT_EQ(storages.size(), layout.size());
}

TEST(RebuildBuckets, FollowBackwardsOrderAfterTheFirstStep) { expect_rebuilt_and_equal(/*set_to_none=*/true); }
TEST(RebuildBuckets, GradientsHeldAcrossTheRebuildAreCarriedOver) { expect_rebuilt_and_equal(false); }

TEST(RebuildBuckets, RanksThatSawDifferentOrdersAgreeOnRankZeros) {
  auto reference = make_model<TwoBranches>(19);
  torch::optim::SGD reference_optimizer(reference->parameters(), torch::optim::SGDOptions(0.1));
  auto replica = make_model<TwoBranches>(19);
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr(), tiny_buckets());
  torch::optim::SGD optimizer(replica->parameters(), torch::optim::SGDOptions(0.1));
  const bool a_first = world().rank() % 2 == 0;
  for (int step = 0; step < 4; ++step) {
    const auto batch = global_batch(step, 12);
    reference_optimizer.zero_grad();
    torch::cross_entropy_loss(reference->forward(batch.inputs, true), batch.targets).backward();
    reference_optimizer.step();
    const auto mine = local_part(batch, world());
    optimizer.zero_grad();
    torch::cross_entropy_loss(ddp(mine.inputs, a_first), mine.targets).backward();
    optimizer.step();
  }
  const auto layout = ddp.bucket_layout();
  EXPECT_TRUE(same_on_all_ranks(layout)) << ::testing::PrintToString(layout);
  // Rank 0 ran `a` first, so backward reached `b` first there.
  const auto names = flat(layout);
  EXPECT_LT(position_of(names, "b."), position_of(names, "a.")) << ::testing::PrintToString(layout);
  EXPECT_LE(max_abs_difference(replica->parameters(), reference->parameters()), 1e-5);
}

TEST(RebuildBuckets, OffKeepsReverseRegistrationOrder) {
  auto replica = make_model<Reversed>(17);
  auto options = tiny_buckets();
  options.rebuild_buckets = false;
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr(), options);
  const auto before = ddp.bucket_layout();
  const auto mine = local_part(global_batch(0, 12), world());
  torch::cross_entropy_loss(ddp(mine.inputs), mine.targets).backward();
  EXPECT_EQ(ddp.bucket_layout(), before);
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
