// DDP equals single-process training on the global batch: same losses step
// by step, same parameters (max abs difference <= 1e-5) after 20 steps, for
// an MLP and a CNN with (Sync)BatchNorm, SGD with momentum and AdamW, default
// buckets (gradients as bucket views, rebuilt after the first step), many
// tiny buckets and gradients copied in and out; at every world size the test
// is launched with.
#include <dtrain/ddp.h>

#include "../common/multirank_gtest.h"
#include "ddp_test_support.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace {

using dtrain::testing::world;
using dtrain::testing::world_ptr;
using namespace ddp_test;

constexpr int kSteps = 20;
constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4

enum class Optimizer { SGD, AdamW };
enum class Buckets { Default, Tiny, Copies };

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Optimizer kind, const std::vector<torch::Tensor>& params) {
  if (kind == Optimizer::SGD) {
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  }
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01).weight_decay(0.01));
}

dtrain::DDPOptions ddp_options(Buckets buckets) {
  dtrain::DDPOptions options;
  if (buckets == Buckets::Tiny) {
    options.bucket_cap_bytes = 600;  // about one tensor per bucket
    options.first_bucket_cap_bytes = 200;
  }
  options.gradient_as_bucket_view = buckets != Buckets::Copies;
  return options;
}

template <class Model>
void expect_same_as_single_process(Optimizer optimizer_kind, Buckets buckets) {
  // Single-process reference, trained by every rank on the whole batch.
  auto reference = make_model<Model>(7);
  auto reference_optimizer = make_optimizer(optimizer_kind, reference->parameters());

  // The replica starts from different weights on each rank: DDP must
  // broadcast rank 0's, which equal the reference's.
  auto replica = make_model<Model>(7 + 100 * world().rank());
  dtrain::set_sync_batch_norm_comm(*replica, world_ptr());
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr(), ddp_options(buckets));
  auto optimizer = make_optimizer(optimizer_kind, replica->parameters());

  for (int step = 0; step < kSteps; ++step) {
    const auto batch = global_batch(step, kGlobalBatch);
    reference_optimizer->zero_grad();
    torch::Tensor reference_loss = torch::cross_entropy_loss(reference->forward(batch.inputs), batch.targets);
    reference_loss.backward();
    reference_optimizer->step();

    const auto mine = local_part(batch, world());
    optimizer->zero_grad();
    torch::Tensor loss = torch::cross_entropy_loss(ddp(mine.inputs), mine.targets);
    loss.backward();
    optimizer->step();

    // The global-batch loss: the mean of the equal-sized local means.
    torch::Tensor global_loss = loss.detach().clone().reshape({1});
    world().all_reduce(global_loss, dtrain::ReduceOp::Avg)->wait();
    EXPECT_NEAR(global_loss.item<double>(), reference_loss.item<double>(), 1e-6) << "step " << step;
  }
  EXPECT_LE(max_abs_difference(replica->parameters(), reference->parameters()), 1e-5);
  EXPECT_LE(max_abs_difference(replica->buffers(), reference->buffers()), 1e-5);
}

TEST(Equivalence, MLP_SGD) { expect_same_as_single_process<TinyMLP>(Optimizer::SGD, Buckets::Default); }
TEST(Equivalence, MLP_AdamW) { expect_same_as_single_process<TinyMLP>(Optimizer::AdamW, Buckets::Default); }
TEST(Equivalence, MLP_SGD_TinyBuckets) { expect_same_as_single_process<TinyMLP>(Optimizer::SGD, Buckets::Tiny); }
TEST(Equivalence, MLP_AdamW_GradientCopies) {
  expect_same_as_single_process<TinyMLP>(Optimizer::AdamW, Buckets::Copies);
}
TEST(Equivalence, CNN_SGD) { expect_same_as_single_process<TinyCNN>(Optimizer::SGD, Buckets::Default); }
TEST(Equivalence, CNN_AdamW) { expect_same_as_single_process<TinyCNN>(Optimizer::AdamW, Buckets::Default); }
TEST(Equivalence, CNN_SGD_TinyBuckets) { expect_same_as_single_process<TinyCNN>(Optimizer::SGD, Buckets::Tiny); }

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
