// The parameter server (include/dtrain/ps.h) on 3 or 4 ranks:
//   - Sync equals single-process training on the global batch (W = 2
//     workers, S = world - 2 servers), SGD with momentum and AdamW;
//   - SSP never lets a worker compute more than s steps ahead of the slowest
//     (from the servers' records), Async records staleness > 0, and both
//     reach a stated loss, with one worker slowed down;
//   - backup workers average exactly the first W - k pushes of each step and
//     count the late ones as dropped;
//   - unequal (throughput-balanced) local batches give the global-batch
//     gradient;
//   - every mode shuts down when workers run different numbers of steps.
// Slowed workers sleep in their loop; no test asserts a time.
#include <dtrain/data.h>
#include <dtrain/ps.h>

#include "../common/multirank_gtest.h"
#include "../ddp/ddp_test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <thread>

namespace {

using dtrain::testing::world;
using dtrain::testing::world_ptr;
namespace ps = dtrain::ps;
using ddp_test::TinyMLP;

constexpr int64_t kGlobalBatch = 12;

ps::OptimizerFactory sgd(double lr, double momentum) {
  return [=](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(lr).momentum(momentum));
  };
}
ps::OptimizerFactory adamw(double lr) {
  return [=](std::vector<torch::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(lr).weight_decay(0.01));
  };
}

// Runs one job: servers serve, workers run `loop` and finish. Returns the
// server's report (empty on workers).
ps::ServerReport run_job(const ps::Group& group, const std::vector<torch::Tensor>& parameters,
                         const ps::OptimizerFactory& optimizer, const std::function<void(ps::Worker&)>& loop) {
  if (group.is_server()) return ps::serve(group, parameters, optimizer);
  ps::Worker worker(group, parameters);
  loop(worker);
  worker.finish();
  return {};
}

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// ------------------------------------------------------------- sync == DDP

void expect_sync_equals_single_process(const ps::OptimizerFactory& make_optimizer, double lr) {
  constexpr int kSteps = 20;
  const int servers = world().size() - 2;
  ps::Group group(world_ptr(), {.mode = ps::Mode::Sync, .servers = servers});
  const int workers = group.workers();

  // Rank 0 (a worker) starts from the reference's weights; every other rank
  // starts elsewhere and must receive them.
  auto model = ddp_test::make_model<TinyMLP>(7 + 100 * world().rank());
  auto reference = ddp_test::make_model<TinyMLP>(7);
  auto reference_optimizer = make_optimizer(reference->parameters());

  std::vector<double> losses;
  run_job(group, model->parameters(), make_optimizer, [&](ps::Worker& worker) {
    while (worker.next_step() < kSteps) {
      const int64_t step = worker.next_step();
      const auto batch = ddp_test::global_batch(step, kGlobalBatch);
      const auto part = dtrain::shard_range(kGlobalBatch, workers, group.worker_index());
      model->zero_grad();
      auto local_sum = torch::nn::functional::cross_entropy(
          model->forward(batch.inputs.narrow(0, part.offset, part.count)), batch.targets.narrow(0, part.offset, part.count),
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
      // Note [global batch loss] (src/train/trainer.cpp).
      (local_sum * (static_cast<double>(workers) / kGlobalBatch)).backward();
      worker.push_and_pull(lr);

      reference_optimizer->zero_grad();
      torch::nn::functional::cross_entropy(reference->forward(batch.inputs), batch.targets).backward();
      reference_optimizer->step();
      EXPECT_LE(ddp_test::max_abs_difference(model->parameters(), reference->parameters()), 1e-5) << "step " << step;
    }
    EXPECT_EQ(worker.next_step(), kSteps);
  });
  if (group.is_worker()) {
    EXPECT_LE(ddp_test::max_abs_difference(model->parameters(), reference->parameters()), 1e-5);
  }
}

TEST(ParameterServer, SyncEqualsSingleProcessSGD) { expect_sync_equals_single_process(sgd(0.05, 0.9), 0.05); }
TEST(ParameterServer, SyncEqualsSingleProcessAdamW) { expect_sync_equals_single_process(adamw(0.01), 0.01); }

// ------------------------------------------ async and SSP, one slow worker

// y = x . w* + 0.5 on 8 inputs: a problem every mode should solve.
struct Regression {
  torch::Tensor true_weights = torch::linspace(-1, 1, 8).reshape({8, 1});
  torch::Tensor batch(int64_t seed, int64_t size) const {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    return torch::randn({size, 8}, generator);
  }
  torch::Tensor targets(const torch::Tensor& x) const { return x.mm(true_weights) + 0.5; }
};

struct SlowJob {
  ps::ServerReport report;
  ps::Summary summary;
  double initial_loss = 0, final_loss = 0;  // on a held-out batch (workers)
  int steps = 0;
};

// S = 1 server; the last worker sleeps `slow_ms` before each push.
SlowJob run_with_slow_worker(ps::Mode mode, int staleness, int steps, int slow_ms) {
  ps::Group group(world_ptr(), {.mode = mode, .servers = 1, .staleness = staleness});
  const Regression problem;
  torch::manual_seed(3);
  torch::nn::Linear model(8, 1);
  const auto held_out = problem.batch(999, 256);
  auto evaluate = [&] {
    torch::NoGradGuard no_grad;
    return torch::mse_loss(model->forward(held_out), problem.targets(held_out)).item<double>();
  };
  SlowJob job;
  job.steps = steps;
  job.report = run_job(group, model->parameters(), sgd(0.05, 0), [&](ps::Worker& worker) {
    job.initial_loss = evaluate();
    const bool slow = group.worker_index() == group.workers() - 1;
    while (worker.next_step() < steps) {
      const auto x = problem.batch(1000 * group.worker_index() + worker.next_step(), 8);
      model->zero_grad();
      torch::mse_loss(model->forward(x), problem.targets(x)).backward();
      if (slow) sleep_ms(slow_ms);
      worker.push_and_pull(0.05);
    }
  });
  if (group.is_worker()) job.final_loss = evaluate();
  job.summary = ps::summarize(group, group.is_server() ? &job.report : nullptr);
  return job;
}

TEST(ParameterServer, StaleSynchronousNeverExceedsTheBound) {
  constexpr int kBound = 2, kSteps = 24;
  const SlowJob job = run_with_slow_worker(ps::Mode::SSP, kBound, kSteps, 40);
  const int workers = world().size() - 1;
  if (world().rank() == world().size() - 1) {  // the server
    // A record for every push, in SSP every push is applied.
    EXPECT_EQ(job.report.pushes, static_cast<int64_t>(workers) * kSteps);
    EXPECT_EQ(static_cast<int64_t>(job.report.records.size()), job.report.pushes);
    int64_t largest_lead = 0;
    std::vector<int64_t> per_worker(static_cast<size_t>(workers), 0);
    for (const auto& record : job.report.records) {
      EXPECT_LE(record.clock_lead, kBound) << "worker " << record.worker << " at clock " << record.clock;
      // Each other worker can push at most 2s+1 times while one computes.
      EXPECT_LE(record.staleness, (workers - 1) * (2 * kBound + 1));
      EXPECT_EQ(record.staleness, record.applied_version - record.read_version);
      largest_lead = std::max(largest_lead, record.clock_lead);
      ++per_worker[static_cast<size_t>(record.worker)];
    }
    // The fast workers did run ahead, up to the bound: the bound was what held them.
    EXPECT_EQ(largest_lead, kBound);
    for (int w = 0; w < workers; ++w) EXPECT_EQ(per_worker[static_cast<size_t>(w)], kSteps) << "worker " << w;
  }
  EXPECT_EQ(job.summary.updates, static_cast<int64_t>(workers) * kSteps);
  EXPECT_GT(job.summary.max_staleness, 0);
  EXPECT_LE(job.summary.max_staleness, (workers - 1) * (2 * kBound + 1));
}

TEST(ParameterServer, AsyncRecordsStalenessOfTheSlowWorker) {
  constexpr int kSteps = 16;
  const SlowJob job = run_with_slow_worker(ps::Mode::Async, 0, kSteps, 20);
  const int workers = world().size() - 1;
  if (world().rank() == world().size() - 1) {
    EXPECT_EQ(static_cast<int64_t>(job.report.records.size()), static_cast<int64_t>(workers) * kSteps);
    int64_t slow_worker_most = 0;
    for (const auto& record : job.report.records)
      if (record.worker == workers - 1) slow_worker_most = std::max(slow_worker_most, record.staleness);
    EXPECT_GT(slow_worker_most, 0) << "the fast workers updated while the slow one computed";
  }
  EXPECT_GT(job.summary.max_staleness, 0);
  EXPECT_GT(job.summary.mean_staleness, 0);
}

// From a held-out MSE above 0.5 to below 1e-3 (the targets are exact).
TEST(ParameterServer, AsyncAndStaleSynchronousReachTheLoss) {
  for (ps::Mode mode : {ps::Mode::Async, ps::Mode::SSP}) {
    const SlowJob job = run_with_slow_worker(mode, 2, 60, 5);
    if (world().rank() < world().size() - 1) {
      EXPECT_GT(job.initial_loss, 0.5) << ps::to_string(mode);
      EXPECT_LT(job.final_loss, 1e-3) << ps::to_string(mode);
    }
  }
}

// ----------------------------------------------------------- backup workers

// Worker w pushes the constant gradient w + 1; the last worker is slow, and
// k = 1 backup worker lets each step go ahead without the last arrival.
TEST(ParameterServer, BackupWorkersAverageTheFirstArrivalsAndDropTheLate) {
  constexpr int kSteps = 10;
  ps::Group group(world_ptr(), {.mode = ps::Mode::Sync, .servers = 1, .backup_workers = 1});
  const int workers = group.workers();
  auto weights = torch::full({5}, 3.0f).set_requires_grad(true);
  int64_t my_pushes = 0;
  const ps::ServerReport report = run_job(group, {weights}, sgd(1.0, 0), [&](ps::Worker& worker) {
    const bool slow = group.worker_index() == workers - 1;
    while (worker.next_step() < kSteps) {
      weights.mutable_grad() = torch::full({5}, static_cast<float>(group.worker_index() + 1));
      if (slow) sleep_ms(30);
      worker.push_and_pull(1.0);
      ++my_pushes;
    }
  });

  // The server: each step used exactly W - 1 pushes; what it applied is the
  // mean of those workers' constants.
  double expected_total_update = 0;
  if (group.is_server()) {
    EXPECT_EQ(static_cast<int>(report.steps.size()), kSteps);
    for (const auto& step : report.steps) {
      EXPECT_EQ(static_cast<int>(step.contributors.size()), workers - 1) << "step " << step.version;
      double mean = 0;
      for (int w : step.contributors) mean += w + 1;
      expected_total_update += mean / static_cast<double>(step.contributors.size());
    }
  }
  // [expected update, dropped, applied steps, pushes of all workers]
  auto facts = torch::zeros({4}, torch::kFloat64);
  if (group.is_server()) {
    facts[0] = expected_total_update;
    facts[1] = static_cast<double>(report.dropped);
    facts[2] = static_cast<double>(report.steps.size());
  } else {
    facts[3] = static_cast<double>(my_pushes);
  }
  world().all_reduce(facts, dtrain::ReduceOp::Sum)->wait();
  const double total_update = facts[0].item<double>();
  const auto dropped = static_cast<int64_t>(facts[1].item<double>());
  const auto applied = static_cast<int64_t>(facts[2].item<double>());
  const auto pushes = static_cast<int64_t>(facts[3].item<double>());
  if (group.is_worker()) {
    // After finish() every worker holds the server's final weights.
    EXPECT_LE((weights.detach() - (3.0 - total_update)).abs().max().item<double>(), 1e-5);
  }
  EXPECT_EQ(dropped, pushes - (workers - 1) * applied) << "every push not used is dropped";
  EXPECT_GE(dropped, 1) << "the slow worker was late";
  EXPECT_EQ(applied, kSteps);
}

// ------------------------------------------------- balanced local batches

// Local batches split by throughput (unequal) through ps-sync give the same
// parameters as one process on the global batch.
TEST(ParameterServer, UnequalLocalBatchesGiveTheGlobalBatchGradient) {
  constexpr int kSteps = 5;
  ps::Group group(world_ptr(), {.mode = ps::Mode::Sync, .servers = 1});
  const int workers = group.workers();
  std::vector<double> throughputs;
  for (int w = 0; w < workers; ++w) throughputs.push_back(1.0 + 2.0 * w);  // worker 0 is slowest
  const auto sizes = dtrain::data::split_batch_by_throughput(kGlobalBatch, throughputs);
  EXPECT_NE(sizes.front(), sizes.back());

  auto model = ddp_test::make_model<TinyMLP>(11);
  auto reference = ddp_test::make_model<TinyMLP>(11);
  torch::optim::SGD reference_optimizer(reference->parameters(), torch::optim::SGDOptions(0.1));
  // A 48-sample dataset; the sampler picks each step's global batch.
  const auto all = ddp_test::global_batch(77, 48);
  dtrain::data::SamplerOptions options{.dataset_size = 48, .global_batch_size = kGlobalBatch,
                                       .world_size = workers, .rank = std::max(0, group.worker_index()), .seed = 5};
  options.local_batch_sizes = sizes;
  const dtrain::data::DistributedSampler sampler(options);
  auto rows = [](const torch::Tensor& t, const std::vector<int64_t>& indices) {
    return t.index_select(0, torch::tensor(indices, torch::kInt64));
  };

  run_job(group, model->parameters(), sgd(0.1, 0), [&](ps::Worker& worker) {
    while (worker.next_step() < kSteps) {
      const int64_t step = worker.next_step();
      const auto local = sampler.local_batch(step);
      model->zero_grad();
      auto local_sum = torch::nn::functional::cross_entropy(
          model->forward(rows(all.inputs, local)), rows(all.targets, local),
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
      (local_sum * (static_cast<double>(workers) / kGlobalBatch)).backward();
      worker.push_and_pull(0.1);

      const auto global = sampler.global_batch(step);
      reference_optimizer.zero_grad();
      torch::nn::functional::cross_entropy(reference->forward(rows(all.inputs, global)), rows(all.targets, global))
          .backward();
      reference_optimizer.step();
    }
  });
  if (group.is_worker()) {
    EXPECT_EQ(static_cast<int64_t>(sampler.local_batch_size()), sizes[static_cast<size_t>(group.worker_index())]);
    EXPECT_LE(ddp_test::max_abs_difference(model->parameters(), reference->parameters()), 1e-5);
  }
}

// ----------------------------------------------------------------- shutdown

// Workers stop after different numbers of steps (worker w: 2 + 3w); every
// mode ends, every push is accounted for, and all workers end with the same
// final parameters.
TEST(ParameterServer, EveryModeShutsDownWithUnequalWork) {
  for (ps::Mode mode : {ps::Mode::Sync, ps::Mode::Async, ps::Mode::SSP}) {
    ps::Group group(world_ptr(), {.mode = mode, .servers = 1, .staleness = 0});
    auto weights = torch::zeros({3}).set_requires_grad(true);
    const int my_steps = 2 + 3 * std::max(0, group.worker_index());
    const ps::ServerReport report = run_job(group, {weights}, sgd(0.1, 0), [&](ps::Worker& worker) {
      for (int step = 0; step < my_steps; ++step) {
        weights.mutable_grad() = torch::ones({3});
        worker.push_and_pull(0.1);
      }
    });
    int64_t expected_pushes = 0;
    for (int w = 0; w < group.workers(); ++w) expected_pushes += 2 + 3 * w;
    if (group.is_server()) {
      EXPECT_EQ(report.pushes, expected_pushes) << ps::to_string(mode);
    }
    // Same final weights on every worker (the server's).
    auto first = weights.detach().clone();
    world().broadcast(first, 0)->wait();
    if (group.is_worker()) {
      EXPECT_TRUE(torch::equal(weights.detach(), first)) << ps::to_string(mode);
    }
  }
}

TEST(ParameterServer, RejectsBadOptions) {
  const int n = world().size();
  EXPECT_THROW(ps::check_options({.servers = 0}, n), std::invalid_argument);
  EXPECT_THROW(ps::check_options({.servers = n}, n), std::invalid_argument);
  EXPECT_THROW(ps::check_options({.mode = ps::Mode::SSP, .staleness = -1}, n), std::invalid_argument);
  EXPECT_THROW(ps::check_options({.mode = ps::Mode::Async, .backup_workers = 1}, n), std::invalid_argument);
  EXPECT_THROW(ps::check_options({.servers = 1, .backup_workers = n - 1}, n), std::invalid_argument);
  EXPECT_NO_THROW(ps::check_options({.servers = 1, .backup_workers = n - 2}, n));
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
