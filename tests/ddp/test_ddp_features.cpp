// DDP beyond plain equivalence: no_sync accumulation, unused parameters,
// models that differ across ranks, bucket layout and gradient views.
#include <dtrain/ddp.h>

#include "../common/multirank_gtest.h"
#include "ddp_test_support.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace {

using dtrain::testing::world;
using dtrain::testing::world_ptr;
using namespace ddp_test;

torch::Tensor loss_on(torch::Tensor logits, const torch::Tensor& targets) {
  return torch::cross_entropy_loss(logits, targets);
}

// Four micro-batches, the first three under no_sync(), each loss scaled by
// 1/4, equal one step on the batch made of all four.
TEST(NoSync, AccumulatedMicroBatchesEqualOneBigBatch) {
  constexpr int kMicro = 4;
  constexpr int64_t kMicroBatch = 12;
  auto reference = make_model<TinyMLP>(3);
  torch::optim::SGD reference_optimizer(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto replica = make_model<TinyMLP>(3);
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr());
  torch::optim::SGD optimizer(replica->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));

  for (int step = 0; step < 3; ++step) {
    std::vector<Batch> micro;
    for (int m = 0; m < kMicro; ++m) micro.push_back(global_batch(100 * step + m, kMicroBatch));

    std::vector<torch::Tensor> inputs, targets;
    for (const auto& b : micro) {
      inputs.push_back(b.inputs);
      targets.push_back(b.targets);
    }
    reference_optimizer.zero_grad();
    loss_on(reference->forward(torch::cat(inputs)), torch::cat(targets)).backward();
    reference_optimizer.step();

    optimizer.zero_grad();
    for (int m = 0; m < kMicro; ++m) {
      const auto mine = local_part(micro[m], world());
      if (m + 1 < kMicro) {
        auto guard = ddp.no_sync();
        (loss_on(ddp(mine.inputs), mine.targets) / kMicro).backward();
      } else {
        (loss_on(ddp(mine.inputs), mine.targets) / kMicro).backward();
      }
    }
    optimizer.step();
    EXPECT_EQ(ddp.last_step().iteration, step + 1) << "one synchronised backward per step";
  }
  EXPECT_LE(max_abs_difference(replica->parameters(), reference->parameters()), 1e-5);
}

TEST(UnusedParameters, TrainLikeSingleProcessWithFindUnused) {
  auto reference = make_model<Branchy>(5);
  torch::optim::AdamW reference_optimizer(reference->parameters(), torch::optim::AdamWOptions(0.01));
  auto replica = make_model<Branchy>(5);
  dtrain::DDPOptions options;
  options.find_unused_parameters = true;
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr(), options);
  torch::optim::AdamW optimizer(replica->parameters(), torch::optim::AdamWOptions(0.01));

  for (int step = 0; step < 6; ++step) {
    const bool use_spare = step % 3 == 2;  // the spare head is unused in most steps
    const auto batch = global_batch(step, 12);
    reference_optimizer.zero_grad();
    loss_on(reference->forward(batch.inputs, use_spare), batch.targets).backward();
    reference_optimizer.step();

    const auto mine = local_part(batch, world());
    optimizer.zero_grad();
    loss_on(ddp(mine.inputs, use_spare), mine.targets).backward();
    // Unused everywhere: no gradient, as in single-process training (so
    // AdamW does not decay it).
    EXPECT_EQ(replica->spare->weight.grad().defined(), use_spare) << "step " << step;
    optimizer.step();
  }
  EXPECT_LE(max_abs_difference(replica->parameters(), reference->parameters()), 1e-5);
}

// Used on rank 0 only: the others contribute zeros to the average.
TEST(UnusedParameters, UsedOnSomeRanksAveragesWithZeros) {
  auto replica = make_model<Branchy>(5);
  dtrain::DDPOptions options;
  options.find_unused_parameters = true;
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr(), options);
  const auto mine = local_part(global_batch(0, 12), world());
  const bool use_spare = world().rank() == 0;

  auto local = make_model<Branchy>(5);  // rank 0's weights, no DDP
  loss_on(local->forward(mine.inputs, use_spare), mine.targets).backward();
  auto expected = use_spare ? local->spare->weight.grad().clone() : torch::zeros_like(local->spare->weight);
  world().all_reduce(expected, dtrain::ReduceOp::Avg)->wait();

  loss_on(ddp(mine.inputs, use_spare), mine.targets).backward();
  ASSERT_TRUE(replica->spare->weight.grad().defined());
  EXPECT_LE((replica->spare->weight.grad() - expected).abs().max().item<double>(), 1e-6);
}

TEST(UnusedParameters, WithoutFindUnusedAClearError) {
  auto replica = make_model<Branchy>(5);
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr());
  const auto mine = local_part(global_batch(0, 12), world());
  std::string message;
  try {
    loss_on(ddp(mine.inputs, false), mine.targets).backward();
  } catch (const std::exception& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("got no gradient"), std::string::npos) << message;
  EXPECT_NE(message.find("spare.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("find_unused_parameters"), std::string::npos) << message;

  // The failed pass left no state behind: a full pass works.
  loss_on(ddp(mine.inputs, true), mine.targets).backward();
  EXPECT_EQ(ddp.last_step().iteration, 1);
}

struct WidthImpl : torch::nn::Module {
  explicit WidthImpl(int64_t width) { fc = register_module("fc", torch::nn::Linear(8, width)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Width);

TEST(Construction, ModelsThatDifferAcrossRanksAreRejected) {
  if (world().size() == 1) GTEST_SKIP() << "needs two ranks";
  Width model(world().rank() == world().size() - 1 ? 5 : 4);
  std::string message;
  try {
    dtrain::DistributedDataParallel ddp(model, world_ptr());
  } catch (const std::exception& error) {
    message = error.what();
  }
  const std::string culprit = "rank " + std::to_string(world().size() - 1);
  EXPECT_NE(message.find("differs across ranks"), std::string::npos) << message;
  EXPECT_NE(message.find(culprit + " has parameter 'fc.weight' float32 [5, 8] where rank 0 has parameter "
                                   "'fc.weight' float32 [4, 8]"),
            std::string::npos)
      << message;
}

TEST(Construction, BroadcastsRankZerosWeightsAndBuffers) {
  auto replica = make_model<TinyCNN>(11 + world().rank());
  replica->norm->running_mean.fill_(world().rank());
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr());
  auto rank0 = make_model<TinyCNN>(11);
  EXPECT_EQ(max_abs_difference(replica->parameters(), rank0->parameters()), 0.0);
  EXPECT_EQ(replica->norm->running_mean.abs().max().item<double>(), 0.0);
}

TEST(Buckets, LayoutFollowsReverseRegistrationAndCaps) {
  auto model = make_model<TinyMLP>(1);
  dtrain::DDPOptions options;
  options.first_bucket_cap_bytes = 1;  // the last parameter alone
  options.bucket_cap_bytes = 32 * 32 * 4 + 32 * 4;  // fc2.weight + fc2.bias, and a bucket may fill it exactly
  auto ddp = dtrain::DistributedDataParallel(model, world_ptr(), options);
  const std::vector<std::vector<std::string>> expected = {
      {"fc3.bias"}, {"fc3.weight", "fc2.bias"}, {"fc2.weight", "fc1.bias"}, {"fc1.weight"}};
  EXPECT_EQ(ddp.bucket_layout(), expected);
}

TEST(Buckets, GradientsAsBucketViewsShareTheBucket) {
  auto model = make_model<TinyMLP>(1);
  auto ddp = dtrain::DistributedDataParallel(model, world_ptr());  // views are the default
  const auto mine = local_part(global_batch(0, 12), world());
  for (int step = 0; step < 2; ++step) {
    model->zero_grad(/*set_to_none=*/false);
    loss_on(ddp(mine.inputs), mine.targets).backward();
  }
  // One bucket (the model is under 1 MiB): every gradient is a slice of it.
  std::set<const void*> storages;
  for (const auto& p : model->parameters()) storages.insert(p.grad().storage().data());
  EXPECT_EQ(storages.size(), 1u);
  EXPECT_EQ(ddp.bucket_layout().size(), 1u);
}

// The first step also broadcasts rank 0's gradient order (one int32 per
// parameter) for the bucket rebuild.
TEST(Stats, AllReduceSendsEveryGradientOnce) {
  auto model = make_model<TinyMLP>(1);
  auto ddp = dtrain::DistributedDataParallel(model, world_ptr());
  const auto mine = local_part(global_batch(0, 12), world());
  int64_t bytes = 0;
  for (const auto& p : model->parameters()) bytes += p.numel() * 4;
  const int64_t order = world().size() > 1 ? static_cast<int64_t>(model->parameters().size()) * 4 : 0;
  for (int step = 1; step <= 2; ++step) {
    loss_on(ddp(mine.inputs), mine.targets).backward();
    EXPECT_EQ(ddp.last_step().bytes_sent, bytes + (step == 1 ? order : 0)) << "step " << step;
    EXPECT_EQ(ddp.last_step().iteration, step);
    EXPECT_GE(ddp.last_step().exposed_comm_s, 0.0);
  }
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }

namespace {

// Issue 23: DDP's bf16 mixed precision (Note [DDP mixed precision]).
dtrain::DDPOptions bf16_options(torch::ScalarType reduce_dtype) {
  dtrain::DDPOptions options;
  options.mixed_precision = dtrain::MixedPrecision{torch::kBFloat16, reduce_dtype, torch::kFloat32};
  return options;
}

void expect_dtype(const std::vector<torch::Tensor>& tensors, torch::ScalarType dtype, const std::string& when) {
  for (const auto& t : tensors) EXPECT_EQ(t.scalar_type(), dtype) << when;
}

// Forward computes in bf16 (the parameters are the bf16 copies, the output
// comes back fp32); after backward the module holds its fp32 masters with
// fp32 averaged gradients; three SGD steps track fp32 DDP to bf16's
// resolution; an evaluation forward leaves the masters in place.
TEST(MixedPrecision, Bf16ComputeFp32MastersAndGradients) {
  for (const auto reduce_dtype : {torch::kFloat32, torch::kBFloat16}) {
    SCOPED_TRACE(std::string("reduce_dtype ") + c10::toString(reduce_dtype));
    auto reference = make_model<TinyMLP>(5);
    auto reference_ddp = dtrain::DistributedDataParallel(reference, world_ptr());
    torch::optim::SGD reference_optimizer(reference->parameters(), 0.1);
    auto replica = make_model<TinyMLP>(5);
    auto ddp = dtrain::DistributedDataParallel(replica, world_ptr(), bf16_options(reduce_dtype));
    torch::optim::SGD optimizer(ddp.parameters(), 0.1);
    for (int step = 0; step < 3; ++step) {
      const auto mine = local_part(global_batch(step, 12), world());
      reference_optimizer.zero_grad();
      loss_on(reference_ddp(mine.inputs), mine.targets).backward();
      reference_optimizer.step();

      optimizer.zero_grad();
      const torch::Tensor logits = ddp(mine.inputs);
      EXPECT_EQ(logits.scalar_type(), torch::kFloat32) << "output_dtype";
      expect_dtype(replica->parameters(), torch::kBFloat16, "between forward and backward");
      loss_on(logits, mine.targets).backward();
      expect_dtype(replica->parameters(), torch::kFloat32, "after backward");
      for (const auto& p : replica->parameters()) {
        ASSERT_TRUE(p.grad().defined());
        EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
      }
      // Every rank holds the same averaged gradient.
      auto first = replica->parameters().front().grad().clone();
      auto sum = first.clone();
      world().all_reduce(sum, dtrain::ReduceOp::Sum)->wait();
      EXPECT_TRUE(torch::allclose(sum, first * world().size(), 0, 1e-6));
      optimizer.step();
    }
    EXPECT_GT(max_abs_difference(replica->parameters(), reference->parameters()), 0) << "bf16 is not fp32";
    EXPECT_LE(max_abs_difference(replica->parameters(), reference->parameters()), 2e-2);
    {
      torch::NoGradGuard no_grad;
      ddp(local_part(global_batch(9, 12), world()).inputs);
    }
    expect_dtype(replica->parameters(), torch::kFloat32, "after a forward without grad");
  }
}


// Issue 36: under no_sync() with bf16 compute, the micro-steps' gradients
// are summed in fp32, not in bf16 (Note [DDP mixed precision]). The
// reference: each micro-batch's bf16 gradient, from a bf16 copy of the same
// model, cast to fp32 and summed in order, then averaged over the ranks.
// Summed in bf16 (as before) the two differ by bf16's rounding, ~1e-3.
TEST(MixedPrecision, NoSyncAccumulatesInFp32) {
  constexpr int kMicro = 8;
  auto reference = make_model<TinyMLP>(7);
  reference->to(torch::kBFloat16);
  auto replica = make_model<TinyMLP>(7);
  auto ddp = dtrain::DistributedDataParallel(replica, world_ptr(), bf16_options(torch::kFloat32));

  std::vector<torch::Tensor> expected;
  for (const auto& p : reference->parameters()) expected.push_back(torch::zeros(p.sizes(), torch::kFloat32));
  for (int m = 0; m < kMicro; ++m) {
    const auto mine = local_part(global_batch(50 + m, 12), world());
    for (auto& p : reference->parameters()) p.mutable_grad() = torch::Tensor();
    loss_on(reference->forward(mine.inputs.to(torch::kBFloat16)).to(torch::kFloat32), mine.targets).backward();
    auto params = reference->parameters();
    for (size_t i = 0; i < params.size(); ++i) expected[i].add_(params[i].grad());
    if (m + 1 < kMicro) {
      auto guard = ddp.no_sync();
      loss_on(ddp(mine.inputs), mine.targets).backward();
    } else {
      loss_on(ddp(mine.inputs), mine.targets).backward();
    }
  }
  auto params = replica->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    world().all_reduce(expected[i], dtrain::ReduceOp::Avg)->wait();
    ASSERT_TRUE(params[i].grad().defined());
    EXPECT_EQ(params[i].grad().scalar_type(), torch::kFloat32);
    const double scale = expected[i].abs().max().item<double>();
    EXPECT_LE((params[i].grad() - expected[i]).abs().max().item<double>(), 1e-6 * scale + 1e-12)
        << "parameter " << i << ": the no_sync() sum is not the fp32 sum of the bf16 gradients";
  }
}

}  // namespace
