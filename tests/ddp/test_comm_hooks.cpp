// Communication hooks: what each compression gives up, measured against the
// exact all-reduce, and the bytes each one sends.
#include <dtrain/ddp.h>

#include "../common/multirank_gtest.h"
#include "ddp_test_support.h"

#include <gtest/gtest.h>

namespace {

using dtrain::testing::world;
using dtrain::testing::world_ptr;
using namespace ddp_test;

// Trains the tiny MLP for `steps` SGD steps through DDP with `hook`; returns
// the final parameters and the last global-batch loss.
struct Trained {
  std::vector<torch::Tensor> parameters;
  double last_loss = 0;
  int64_t bytes_per_step = 0;
};

Trained train_mlp(dtrain::CommHookPtr hook, int steps, double lr = 0.1) {
  auto model = make_model<TinyMLP>(21);
  dtrain::DDPOptions options;
  options.comm_hook = std::move(hook);
  auto ddp = dtrain::DistributedDataParallel(model, world_ptr(), options);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(lr).momentum(0.9));
  Trained result;
  for (int step = 0; step < steps; ++step) {
    const auto mine = local_part(global_batch(step % 8, 48), world());  // 8 batches, revisited
    optimizer.zero_grad();
    auto loss = torch::cross_entropy_loss(ddp(mine.inputs), mine.targets);
    loss.backward();
    optimizer.step();
    auto global = loss.detach().reshape({1});
    world().all_reduce(global, dtrain::ReduceOp::Avg)->wait();
    result.last_loss = global.item<double>();
  }
  for (const auto& p : model->parameters()) result.parameters.push_back(p.detach().clone());
  result.bytes_per_step = ddp.last_step().bytes_sent;
  return result;
}

// bf16 and fp16 round each averaged gradient once per step: after 20 steps
// of SGD with momentum the weights (O(0.1)) stay within 1e-2 of the fp32
// run (measured: 4.2e-3 for both at 3 ranks; the rounding is amplified by
// training itself, so fp16's finer mantissa hardly helps).
TEST(Hooks, LowPrecisionStaysCloseToFullPrecision) {
  const auto exact = train_mlp(dtrain::hooks::allreduce(), 20);
  const auto bf16 = train_mlp(dtrain::hooks::bf16_compress(), 20);
  const auto fp16 = train_mlp(dtrain::hooks::fp16_compress(), 20);
  EXPECT_LE(max_abs_difference(bf16.parameters, exact.parameters), 1e-2);
  EXPECT_LE(max_abs_difference(fp16.parameters, exact.parameters), 1e-2);
  EXPECT_GT(max_abs_difference(bf16.parameters, exact.parameters), 0.0) << "bf16 must actually round";
  EXPECT_EQ(bf16.bytes_per_step * 2, exact.bytes_per_step);
  EXPECT_EQ(fp16.bytes_per_step * 2, exact.bytes_per_step);
}

// A layer whose gradient we choose: loss = sum(weight * G) gives dL/dW = G.
torch::Tensor reduced_gradient(dtrain::CommHookPtr hook, const torch::Tensor& local_gradient, int64_t* bytes) {
  auto layer = torch::nn::Linear(torch::nn::LinearOptions(local_gradient.size(1), local_gradient.size(0)).bias(false));
  dtrain::DDPOptions options;
  options.comm_hook = std::move(hook);
  auto ddp = dtrain::DistributedDataParallel(layer, world_ptr(), options);
  (layer->weight * local_gradient).sum().backward();
  if (bytes) *bytes = ddp.last_step().bytes_sent;
  return layer->weight.grad().clone();
}

// Rank r's gradient: A_r B_r with a column space shared by all ranks, so the
// average has rank `rank`.
torch::Tensor low_rank_gradient(int rank_of_average, int salt) {
  auto shared = at::make_generator<at::CPUGeneratorImpl>(77 + salt);
  auto mine = at::make_generator<at::CPUGeneratorImpl>(1000 * salt + world().rank());
  auto columns = torch::randn({48, rank_of_average}, shared);
  return columns.matmul(torch::randn({rank_of_average, 32}, mine));
}

TEST(Hooks, PowerSGDReproducesAGradientOfItsRankExactly) {
  const auto gradient = low_rank_gradient(2, 1);
  auto expected = gradient.clone();
  world().all_reduce(expected, dtrain::ReduceOp::Avg)->wait();

  int64_t bytes = 0;
  dtrain::hooks::PowerSGDOptions options;
  options.rank = 2;
  const auto got = reduced_gradient(dtrain::hooks::powersgd(options), gradient, &bytes);
  const double scale = expected.abs().max().item<double>();
  EXPECT_LE((got - expected).abs().max().item<double>(), 1e-4 * scale);
  EXPECT_EQ(bytes, (48 + 32) * 2 * 4) << "P (48x2) and Q (32x2) in fp32";

  // The same hook on a gradient of rank 4 must approximate, not copy: the
  // test above cannot pass by accident.
  const auto richer = low_rank_gradient(4, 2);
  auto richer_average = richer.clone();
  world().all_reduce(richer_average, dtrain::ReduceOp::Avg)->wait();
  const auto approximate = reduced_gradient(dtrain::hooks::powersgd(options), richer, nullptr);
  EXPECT_GT((approximate - richer_average).abs().max().item<double>(),
            1e-2 * richer_average.abs().max().item<double>());
}

// Before start_iteration PowerSGD is a plain all-reduce.
TEST(Hooks, PowerSGDWaitsForItsStartIteration) {
  const auto gradient = low_rank_gradient(4, 3);
  auto expected = gradient.clone();
  world().all_reduce(expected, dtrain::ReduceOp::Avg)->wait();
  dtrain::hooks::PowerSGDOptions options;
  options.start_iteration = 1;
  int64_t bytes = 0;
  const auto got = reduced_gradient(dtrain::hooks::powersgd(options), gradient, &bytes);
  EXPECT_LE((got - expected).abs().max().item<double>(), 1e-6);
  EXPECT_EQ(bytes, 48 * 32 * 4);
}

// PowerSGD and top-k (1% of each bucket, with error feedback) still train:
// the loss falls from ~1.4 to below 0.5 in 200 steps (the exact all-reduce
// reaches ~0.02).
TEST(Hooks, CompressedTrainingStillLearns) {
  dtrain::hooks::PowerSGDOptions powersgd;
  powersgd.rank = 2;
  dtrain::hooks::TopKOptions topk;
  topk.ratio = 0.01;
  const auto exact = train_mlp(dtrain::hooks::allreduce(), 200, 0.05);
  const auto low_rank = train_mlp(dtrain::hooks::powersgd(powersgd), 200, 0.05);
  const auto sparse = train_mlp(dtrain::hooks::topk(topk), 200, 0.05);
  if (world().rank() == 0) {
    std::cout << "loss after 200 steps: allreduce " << exact.last_loss << ", powersgd " << low_rank.last_loss
              << ", topk " << sparse.last_loss << "; bytes per step " << exact.bytes_per_step << " / "
              << low_rank.bytes_per_step << " / " << sparse.bytes_per_step << std::endl;
  }
  EXPECT_LT(low_rank.last_loss, 0.5);
  EXPECT_LT(sparse.last_loss, 0.5);
  EXPECT_LT(low_rank.bytes_per_step * 4, exact.bytes_per_step);
  EXPECT_LT(sparse.bytes_per_step * 20, exact.bytes_per_step);
}

// Issue 16, item 7: error feedback is what makes aggressive compression
// train. PowerSGD of rank 1 and top-k of 1%, 200 steps, with and without
// error feedback, next to the exact all-reduce on the same problem.
// Measured (2026-12-01, 1-3 ranks): exact 0.0012; with error feedback
// PowerSGD 0.00075-0.00079 and top-k 0.00024-0.00053 (at most 0.7x the
// exact loss); without it 0.25-0.30 and 0.38-0.46 (300-1900x worse). The
// checks: without is at least 10x worse, with is within 2x of exact.
TEST(Hooks, ErrorFeedbackMatters) {
  auto powersgd = [](bool feedback) {
    dtrain::hooks::PowerSGDOptions options;
    options.rank = 1;
    options.error_feedback = feedback;
    return dtrain::hooks::powersgd(options);
  };
  auto topk = [](bool feedback) {
    dtrain::hooks::TopKOptions options;
    options.ratio = 0.01;
    options.error_feedback = feedback;
    return dtrain::hooks::topk(options);
  };
  const double exact = train_mlp(dtrain::hooks::allreduce(), 200, 0.05).last_loss;
  const double powersgd_on = train_mlp(powersgd(true), 200, 0.05).last_loss;
  const double powersgd_off = train_mlp(powersgd(false), 200, 0.05).last_loss;
  const double topk_on = train_mlp(topk(true), 200, 0.05).last_loss;
  const double topk_off = train_mlp(topk(false), 200, 0.05).last_loss;
  if (world().rank() == 0) {
    std::cout << "loss after 200 steps on " << world().size() << " rank(s): allreduce " << exact
              << "; powersgd rank 1 with error feedback " << powersgd_on << ", without " << powersgd_off
              << "; topk 1% with " << topk_on << ", without " << topk_off << std::endl;
  }
  EXPECT_GT(powersgd_off, 10 * powersgd_on) << "error feedback should matter for PowerSGD of rank 1";
  EXPECT_GT(topk_off, 10 * topk_on) << "error feedback should matter for top-k 1%";
  EXPECT_LT(powersgd_on, 2 * exact) << "PowerSGD with error feedback should come within 2x of the exact loss";
  EXPECT_LT(topk_on, 2 * exact) << "top-k with error feedback should come within 2x of the exact loss";
}

TEST(Hooks, ByNameKnowsEveryHookAndRejectsOthers) {
  for (const char* name : {"none", "allreduce", "bf16", "fp16", "powersgd", "topk"}) {
    EXPECT_NE(dtrain::hooks::by_name(name), nullptr) << name;
  }
  try {
    dtrain::hooks::by_name("zip");
    ADD_FAILURE() << "expected an error";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("allowed: none, bf16, fp16, powersgd, topk"), std::string::npos);
  }
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
