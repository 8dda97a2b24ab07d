// The pieces of a training run, one process: learning-rate schedule, memory
// accounting, progress formatting, the metrics file, config checks, and one
// tiny run through the library call.
#include "dtrain/comm.h"
#include "dtrain/memory.h"
#include "dtrain/strategy_table.h"
#include "dtrain/train.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/peak_flops.h"
#include "train/step_loop.h"
#include "train/progress.h"

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

using dtrain::train::learning_rate;
using dtrain::train::LRSchedule;

TEST(LRSchedule, WarmupRisesLinearlyToThePeak) {
  const LRSchedule s{.peak_lr = 1.0, .warmup_steps = 4, .total_steps = 20};
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 0.25);
  EXPECT_DOUBLE_EQ(learning_rate(s, 1), 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(s, 3), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(s, 4), 1.0);  // the decay starts at the peak
}

TEST(LRSchedule, CosineDecaysToTenPercentAtTheLastStep) {
  const LRSchedule s{.peak_lr = 2.0, .warmup_steps = 0, .total_steps = 11};
  EXPECT_DOUBLE_EQ(learning_rate(s, 0), 2.0);
  EXPECT_NEAR(learning_rate(s, 5), 0.2 + 1.8 * 0.5, 1e-12);  // half way: the mean of peak and floor
  EXPECT_NEAR(learning_rate(s, 10), 0.2, 1e-12);
  for (int64_t step = 1; step < 11; ++step) EXPECT_LT(learning_rate(s, step), learning_rate(s, step - 1));
}

TEST(LRSchedule, NoStepsAfterWarmupKeepThePeak) {
  const LRSchedule s{.peak_lr = 1.0, .warmup_steps = 5, .total_steps = 5};
  EXPECT_DOUBLE_EQ(learning_rate(s, 4), 1.0);
  const LRSchedule one{.peak_lr = 0.1, .warmup_steps = 0, .total_steps = 1};
  EXPECT_DOUBLE_EQ(learning_rate(one, 0), 0.1);
}

TEST(TrackingAllocator, CountsLiveAndPeakBytes) {
  dtrain::memory::install_tracking_allocator();
  dtrain::memory::install_tracking_allocator();  // idempotent
  ASSERT_TRUE(dtrain::memory::tracking_allocator_installed());
  const int64_t before = dtrain::memory::live_bytes();
  dtrain::memory::reset_peak();
  {
    auto tensor = torch::empty({1000}, torch::kFloat32);
    EXPECT_EQ(dtrain::memory::live_bytes() - before, 4000);
    auto other = torch::empty({250}, torch::kFloat64);
    EXPECT_EQ(dtrain::memory::live_bytes() - before, 6000);
  }
  EXPECT_EQ(dtrain::memory::live_bytes(), before);
  EXPECT_EQ(dtrain::memory::peak_bytes() - before, 6000);
  dtrain::memory::reset_peak();
  EXPECT_EQ(dtrain::memory::peak_bytes(), before);
}

// oneDNN kernels allocate through the raw interface, which needs the data
// pointer as the DataPtr's context.
TEST(TrackingAllocator, SupportsTheRawInterfaceAndOneDNN) {
  dtrain::memory::install_tracking_allocator();
  c10::Allocator* allocator = c10::GetCPUAllocator();
  const int64_t before = dtrain::memory::live_bytes();
  void* raw = allocator->raw_allocate(512);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(raw) % 64, 0u);
  EXPECT_EQ(dtrain::memory::live_bytes() - before, 512);
  allocator->raw_deallocate(raw);
  EXPECT_EQ(dtrain::memory::live_bytes(), before);

  auto images = torch::randn({2, 1, 8, 8});
  auto weight = torch::randn({4, 1, 3, 3});
  auto out = torch::conv2d(images, weight, {}, 1, 1);
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 4, 8, 8}));
}

TEST(TrackingAllocator, CapGivesAClearOutOfMemoryError) {
  dtrain::memory::install_tracking_allocator();
  dtrain::memory::set_limit_bytes(dtrain::memory::live_bytes() + (1 << 20));
  std::string message;
  try {
    auto big = torch::empty({4 << 20}, torch::kFloat32);  // 16 MiB, over the 1 MiB headroom
  } catch (const c10::OutOfMemoryError& error) {
    message = error.what();
  }
  auto small = torch::empty({1024}, torch::kFloat32);  // within the cap: fine
  dtrain::memory::set_limit_bytes(0);
  EXPECT_NE(message.find("is out of memory: a tensor of 16777216 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("rank "), std::string::npos) << message;
  EXPECT_NE(message.find("DTRAIN_MEMORY_CAP_MB"), std::string::npos) << message;
}

TEST(TrackingAllocator, PeakRSSIsReported) { EXPECT_GT(dtrain::memory::peak_rss_bytes(), 1 << 20); }

TEST(Progress, FormatsBytesAndDurations) {
  using dtrain::train::format_bytes;
  using dtrain::train::format_duration;
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3 << 20), "3.00 MiB");
  EXPECT_EQ(format_bytes(int64_t{150} << 20), "150 MiB");
  EXPECT_EQ(dtrain::train::format_count(60000), "60,000");
  EXPECT_EQ(dtrain::train::format_count(-1234567), "-1,234,567");
  EXPECT_EQ(dtrain::train::format_count(999), "999");
  EXPECT_EQ(format_duration(45), "45s");
  EXPECT_EQ(format_duration(187), "3m07s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_duration(NAN), "?");
}

TEST(Progress, PlainLinesEveryLogEverySteps) {
  std::ostringstream out;
  dtrain::train::ProgressLine line(out, /*live=*/false, /*log_every=*/5);
  for (int64_t step = 1; step <= 12; ++step)
    line.update({.step = step, .total = 12, .loss = 1.5, .rate = 100, .rate_unit = "samples/s", .eta_s = 3,
                 .peak_bytes_per_rank = {1 << 20, 2 << 20}});
  const std::string text = out.str();
  EXPECT_NE(text.find("step 5/12  loss 1.5000  100 samples/s  ETA 3s  peak mem 1.00 MiB | 2.00 MiB\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("step 10/12"), std::string::npos);
  EXPECT_NE(text.find("step 12/12"), std::string::npos);  // the last step always
  EXPECT_EQ(text.find("step 11/12"), std::string::npos);
  EXPECT_EQ(text.find('\r'), std::string::npos);
}

TEST(Progress, LiveLineIsRewrittenAndMessagesGoAbove) {
  std::ostringstream out;
  {
    dtrain::train::ProgressLine line(out, /*live=*/true, /*log_every=*/10);
    line.update({.step = 1, .total = 2, .loss = 2, .rate = 1, .rate_unit = "tokens/s", .eta_s = 1, .peak_bytes_per_rank = {}});
    line.message("eval");
    line.update({.step = 2, .total = 2, .loss = 1, .rate = 1, .rate_unit = "tokens/s", .eta_s = 1, .peak_bytes_per_rank = {}});
  }
  const std::string text = out.str();
  EXPECT_NE(text.find("\rstep 1/2"), std::string::npos);
  EXPECT_NE(text.find("\reval\x1b[K\nstep 1/2"), std::string::npos) << text;
  EXPECT_NE(text.find("\rstep 2/2"), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
}

TEST(Metrics, WritesOneJsonObjectPerLine) {
  const auto path = std::filesystem::temp_directory_path() / ("dtrain_metrics_" + std::to_string(getpid()) + ".jsonl");
  {
    std::ofstream(path) << "old content\n";
    dtrain::train::MetricsWriter writer(path.string());
    writer.write({{"step", 1}, {"loss", 2.5}});
    writer.write({{"step", 2}, {"loss", NAN}});
  }
  std::ifstream in(path);
  std::string first, second, third;
  std::getline(in, first);
  std::getline(in, second);
  EXPECT_EQ(first, R"({"step":1,"loss":2.5})");
  EXPECT_EQ(second, R"({"step":2,"loss":null})");
  EXPECT_FALSE(std::getline(in, third));
  std::filesystem::remove(path);
}

// A step line for every multiple of log_every reached, also when step
// numbers are jumped over (a parameter-server worker whose push was late),
// and for the last step; a resumed run does not repeat the line it resumed at.
TEST(Metrics, StepLogLinesSurviveJumps) {
  const auto path = std::filesystem::temp_directory_path() / ("dtrain_steplog_" + std::to_string(getpid()) + ".jsonl");
  auto steps_logged = [&](int64_t log_every, std::vector<int64_t> dones, int64_t total) {
    std::vector<int64_t> logged;
    {
      dtrain::train::MetricsWriter writer(path.string());
      dtrain::train::StepLog log(writer, log_every, "samples_per_s");
      for (int64_t done : dones) log.record(done, total, 1.0, 0.1, 0.01, 10, dtrain::train::StepOutcome{});
    }
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) logged.push_back(nlohmann::json::parse(line).at("step").get<int64_t>());
    return logged;
  };
  EXPECT_EQ(steps_logged(10, {1, 2, 8, 11, 15, 18, 20}, 20), (std::vector<int64_t>{11, 20}));
  EXPECT_EQ(steps_logged(1, {1, 2, 5, 6}, 9), (std::vector<int64_t>{1, 2, 5, 6}));
  EXPECT_EQ(steps_logged(3, {1, 2, 3, 4, 5, 6}, 6), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(steps_logged(10, {51, 52, 60, 61}, 70), (std::vector<int64_t>{60}));  // resumed after step 50
  std::filesystem::remove(path);
}

// Issue 17: one row per strategy, read by every check.
TEST(StrategyTable, NamesAliasesAndFlags) {
  const auto names = dtrain::strategy_names();
  EXPECT_EQ(names, (std::vector<std::string>{"single", "ddp", "zero1", "zero2", "fsdp", "hsdp", "ps-sync", "ps-async",
                                             "ps-ssp"}));
  for (const auto& row : dtrain::strategy_table()) {
    EXPECT_EQ(dtrain::find_strategy(row.name), &row);
    for (const char* alias : row.aliases) EXPECT_EQ(dtrain::find_strategy(alias), &row) << alias;
    EXPECT_TRUE(dtrain::strategy_available(row.name));
    if (row.engine == dtrain::StrategyEngine::FSDP) {
      EXPECT_EQ(&dtrain::strategy_of(row.sharding), &row) << row.name;
    }
  }
  // Older manifests' words still name their strategy, but are no --strategy.
  EXPECT_STREQ(dtrain::strategy_info("full").name, "fsdp");
  EXPECT_STREQ(dtrain::strategy_info("hybrid").name, "hsdp");
  EXPECT_FALSE(dtrain::strategy_available("full"));
  EXPECT_STREQ(dtrain::strategy_of(dtrain::Sharding::None).name, "ddp");
  EXPECT_EQ(dtrain::find_strategy("zero9"), nullptr);
  try {
    dtrain::strategy_info("zero9");
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("unknown strategy 'zero9'; one of single, ddp, zero1"), std::string::npos);
  }
  EXPECT_EQ(dtrain::strategy_list([](const dtrain::StrategyInfo& r) { return r.planned; }), "ddp, zero1, zero2, fsdp, hsdp");
  EXPECT_TRUE(dtrain::strategy_info("ps-async").grad_clip);
  EXPECT_TRUE(dtrain::strategy_info("ps-ssp").checkpoints);
  EXPECT_TRUE(dtrain::strategy_info("ps-async").trace);
  EXPECT_TRUE(dtrain::strategy_info("ps-sync").backup_workers);
  EXPECT_FALSE(dtrain::strategy_info("ps-ssp").backup_workers);
}

TEST(Metrics, MissingFolderIsAClearError) {
  try {
    dtrain::train::MetricsWriter writer("/nonexistent-dtrain-folder/m.jsonl");
    FAIL() << "expected an error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent-dtrain-folder/m.jsonl"), std::string::npos);
  }
}

dtrain::TrainConfig tiny_mlp() {
  dtrain::TrainConfig config;
  config.model = "mlp";
  config.mlp_hidden = {16};
  config.strategy = "single";
  config.steps = 3;
  config.batch_size = 8;
  config.print = false;
  return config;
}

void expect_invalid(const dtrain::TrainConfig& config, int world_size, const std::string& words) {
  try {
    dtrain::check_train_config(config, world_size);
    ADD_FAILURE() << "expected std::invalid_argument mentioning " << words;
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
  }
}

TEST(TrainConfig, ChecksNameTheFlag) {
  auto c = tiny_mlp();
  EXPECT_NO_THROW(dtrain::check_train_config(c, 1));
  expect_invalid(c, 2, "--strategy single");
  c.strategy = "ddp";
  expect_invalid(c, 9, "--batch-size 8");
  c.strategy = "fsdp";
  c.compress = "topk";
  expect_invalid(c, 1, "--compress topk compresses DDP's gradient all-reduce");
  c = tiny_mlp();
  c.data = "text:/etc/hostname";
  expect_invalid(c, 1, "--model gpt");
  c = tiny_mlp();
  c.model = "gpt";
  c.data = "text:/nonexistent-dtrain-corpus";
  expect_invalid(c, 1, "no such file or folder");
  c = tiny_mlp();
  c.epochs = 1;
  expect_invalid(c, 1, "exactly one of --steps");
  c = tiny_mlp();
  c.metrics_path = "/nonexistent-dtrain-folder/m.jsonl";
  expect_invalid(c, 1, "does not exist");
}

TEST(RunTraining, TinyMLPInProcess) {
  auto world = dtrain::init(dtrain::InitOptions{.backend = "self"});
  const dtrain::TrainResult result = dtrain::run_training(tiny_mlp(), world);
  ASSERT_EQ(result.losses.size(), 3u);
  for (double loss : result.losses) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_EQ(result.steps, 3);
  ASSERT_TRUE(result.eval_accuracy.has_value());
  EXPECT_GE(*result.eval_accuracy, 0.0);
  EXPECT_EQ(result.peak_memory_bytes_per_rank.size(), 1u);
  EXPECT_GT(result.peak_memory_bytes, 0);
}

}  // namespace

// Note [the loss one step late]: a source whose loss arrives with the next
// step. Every step is recorded once, in order, with its own loss; the loop
// asks for a collective read (settle_loss) only where something must see the
// loss at once: a checkpoint (every 4 here), a stop, the end. Not per step.
namespace {

class LateLossSource final : public dtrain::train::StepSource {
 public:
  explicit LateLossSource(int64_t stop_after) : stop_after_(stop_after) {}
  int64_t next_step() const override { return next_; }
  dtrain::train::StepOutcome run_step(int64_t step) override {
    dtrain::train::StepOutcome outcome;
    outcome.loss = std::nan("");  // not known yet
    outcome.loss_late = true;
    if (pending_) outcome.previous_loss = loss_of(*pending_);
    pending_ = step + 1;
    next_ = step + 1;
    outcome.stop_requested = next_ == stop_after_;
    return outcome;
  }
  dtrain::Communicator* lockstep_ranks() override { return nullptr; }
  void resplit(const std::vector<int64_t>&) override {}
  void save_checkpoint(int64_t step) override { saved.push_back(step); }
  dtrain::train::Evaluation evaluate() override { return {}; }
  double settle_loss() override {
    settled.push_back(*pending_);
    const double loss = loss_of(*pending_);
    pending_.reset();
    return loss;
  }
  static double loss_of(int64_t step) { return 10.0 - 0.5 * static_cast<double>(step); }

  std::vector<int64_t> saved, settled;

 private:
  int64_t next_ = 0;
  int64_t stop_after_;
  std::optional<int64_t> pending_;  // the step (1-based) whose loss is not read yet
};

std::vector<double> late_loss_run(int64_t total, LateLossSource& source,
                                  dtrain::TrainResult& result) {
  dtrain::TrainConfig config;
  config.checkpoint_dir = "unused";  // save_checkpoint is the source's
  config.checkpoint_every = 4;
  config.log_every = 1;
  dtrain::train::MetricsWriter metrics;
  dtrain::train::Stragglers stragglers(config, 0, 0, 1);
  dtrain::train::StepLoop loop(config, total, 8, "samples", /*printing=*/false, metrics, stragglers, result);
  loop.run(source);
  return result.losses;
}

}  // namespace

TEST(StepLoop, LateLossesAreRecordedInOrderAndReadAtOnceOnlyWhereNeeded) {
  LateLossSource source(/*stop_after=*/-1);
  dtrain::TrainResult result;
  const auto losses = late_loss_run(10, source, result);
  std::vector<double> expected;
  for (int64_t step = 1; step <= 10; ++step) expected.push_back(LateLossSource::loss_of(step));
  EXPECT_EQ(losses, expected);
  EXPECT_EQ(source.saved, (std::vector<int64_t>{4, 8, 10}));
  EXPECT_EQ(source.settled, (std::vector<int64_t>{4, 8, 10})) << "read at once before each save and at the end only";
}

TEST(StepLoop, AStopSettlesTheLateLossFirst) {
  LateLossSource source(/*stop_after=*/6);
  dtrain::TrainResult result;
  const auto losses = late_loss_run(10, source, result);
  EXPECT_EQ(losses.size(), 6u);
  EXPECT_EQ(losses.back(), LateLossSource::loss_of(6));
  EXPECT_EQ(source.settled, (std::vector<int64_t>{4, 6}));
}

// One FLOP count everywhere (train::model_flops_per_unit, PaLM's convention):
// 6 per matrix-product parameter per token plus attention's 12 L T C; tables
// read by index (GPT's positions, Llama's untied token embeddings) do no
// multiply-adds. GPT's token table is its tied head, so it counts.
TEST(ModelFlops, OneConventionLeavesOutLookupTablesOnly) {
  dtrain::TrainConfig c;
  c.gpt_layers = 2, c.gpt_dim = 64, c.gpt_heads = 4, c.seq_len = 32, c.vocab_size = 256;
  const int64_t parameters = 1'000'000;
  const double attention = 12.0 * 2 * 32 * 64;
  c.model = "gpt";
  EXPECT_DOUBLE_EQ(dtrain::train::model_flops_per_unit(c, parameters), 6.0 * (parameters - 32 * 64) + attention);
  c.model = "llama";
  EXPECT_DOUBLE_EQ(dtrain::train::model_flops_per_unit(c, parameters), 6.0 * (parameters - 256 * 64) + attention);
  c.tie_embeddings = true;
  EXPECT_DOUBLE_EQ(dtrain::train::model_flops_per_unit(c, parameters), 6.0 * parameters + attention);
  c.model = "mlp";
  EXPECT_DOUBLE_EQ(dtrain::train::model_flops_per_unit(c, parameters), 6.0 * parameters);
}

// A step faster than the peak allows shows the peak is wrong: no MFU then
// (make demo once printed "MFU 198.5%" against a probe taken under load).
TEST(ModelFlops, AnMfuAboveOneIsNeverShown) {
  const dtrain::train::Utilization utilization{.flops_per_unit = 10, .peak_flops = 1000};
  EXPECT_DOUBLE_EQ(utilization.mfu(50), 0.5);
  EXPECT_FALSE(utilization.implausible(50));
  EXPECT_DOUBLE_EQ(utilization.mfu(150), 0) << "150 units/s x 10 FLOP = 1.5 x the peak";
  EXPECT_TRUE(utilization.implausible(150));
}
