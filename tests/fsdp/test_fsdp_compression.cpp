// Compressed FSDP collectives (FSDPOptions::compression, docs/fsdp.md
// "Compressed collectives"): the records' arithmetic, training that follows
// the uncompressed run, the bytes the engine hands to collectives (counted
// by FullyShardedBase::last_step() and predicted by dtrain plan), and the
// options the engine refuses.
#include <dtrain/fsdp.h>
#include <dtrain/plan.h>

#include "../common/multirank_gtest.h"
#include "../ddp/ddp_test_support.h"
#include "fsdp/compression.h"
#include "fsdp_test_models.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <string>

namespace {

using dtrain::CollectiveCompression;
using dtrain::GradCompression;
using dtrain::ParamCompression;
using dtrain::Sharding;
using dtrain::fsdp_rules::WireFormat;
using dtrain::testing::world;
using dtrain::testing::world_ptr;
using namespace fsdp_test;

ddp_test::Batch token_batch(int64_t step, int64_t size) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(700 + step);
  auto tokens = torch::randint(0, 256, {size, tiny_gpt_config().seq_len + 1}, generator);
  return {tokens.narrow(1, 0, tiny_gpt_config().seq_len), tokens.narrow(1, 1, tiny_gpt_config().seq_len)};
}

torch::Tensor gpt_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

// ---------------------------------------------------------------- records

torch::Tensor round_trip(WireFormat format, int64_t block, const torch::Tensor& values) {
  const int64_t bytes = dtrain::fsdp_rules::record_bytes(format, values.numel(), block, 4);
  auto record = torch::full({bytes + 3}, 0xAB, torch::kByte);  // 3 guard bytes: nothing writes past the record
  dtrain::detail::encode_record(format, block, values, record.narrow(0, 0, bytes));
  EXPECT_TRUE(torch::all(record.narrow(0, bytes, 3) == 0xAB).item<bool>()) << "a record overran its size";
  return dtrain::detail::decode_record(format, block, record.narrow(0, 0, bytes), values.numel());
}

TEST(Records, SizesAreScalesPlusOneBytePerElement) {
  using dtrain::fsdp_rules::record_bytes;
  EXPECT_EQ(record_bytes(WireFormat::Plain, 1000, 256, 4), 4000);
  EXPECT_EQ(record_bytes(WireFormat::BF16, 1000, 256, 4), 2000);
  EXPECT_EQ(record_bytes(WireFormat::Int8, 1024, 256, 4), 1024 + 4 * 4);  // (256 + 4) / (256 * 4) of fp32
  EXPECT_EQ(record_bytes(WireFormat::Int8, 1000, 256, 4), 1000 + 4 * 4);  // a short last block has its own scale
  EXPECT_EQ(record_bytes(WireFormat::FP8, 1, 256, 4), 1 + 4);
}

// Symmetric int8 per block: each element within half a step (scale / 2) of
// its value, where scale = absmax / 127 of its own block; zeros stay zeros.
TEST(Records, Int8ErrorIsHalfAStepOfItsBlock) {
  torch::manual_seed(11);
  const int64_t block = 64, count = 64 * 5 + 17;  // a short last block
  auto values = torch::randn({count});
  values.narrow(0, 64, 64).mul_(100);   // one loud block must not coarsen the others
  values.narrow(0, 128, 64).zero_();   // a silent block
  const auto back = round_trip(WireFormat::Int8, block, values);
  for (int64_t begin = 0; begin < count; begin += block) {
    const int64_t n = std::min(block, count - begin);
    const auto v = values.narrow(0, begin, n), b = back.narrow(0, begin, n);
    const double step = v.abs().max().item<double>() / 127;
    EXPECT_LE((v - b).abs().max().item<double>(), step / 2 * (1 + 1e-4) + 1e-12) << "block at " << begin;
  }
  EXPECT_TRUE(torch::all(back.narrow(0, 128, 64) == 0).item<bool>()) << "a block of zeros decodes to zeros";
}

TEST(Records, Bf16AndFp8RoundTrip) {
  torch::manual_seed(12);
  const auto values = torch::randn({1000});
  EXPECT_TRUE(torch::equal(round_trip(WireFormat::BF16, 256, values), values.to(torch::kBFloat16).to(torch::kFloat)));
  // e4m3 has 3 mantissa bits: relative error at most 2^-4 for values in its
  // normal range (scaled so the block's absmax is 448).
  const auto back = round_trip(WireFormat::FP8, 256, values);
  for (int64_t begin = 0; begin < 1000; begin += 256) {
    const int64_t n = std::min<int64_t>(256, 1000 - begin);
    const auto v = values.narrow(0, begin, n), b = back.narrow(0, begin, n);
    const double absmax = v.abs().max().item<double>();
    // Below e4m3's smallest normal (2^-6 of 448's scale) the spacing is fixed.
    const auto allowed = v.abs() / 16 + absmax / 448 * std::pow(2.0, -9);
    EXPECT_TRUE(torch::all((v - b).abs() <= allowed * (1 + 1e-5)).item<bool>()) << "block at " << begin;
  }
}

// ---------------------------------------------------------------- training

struct Run {
  std::map<std::string, torch::Tensor> weights;  // fp32, full, after training
  std::vector<double> losses;
  dtrain::FSDPStepStats last;
  std::vector<dtrain::FSDPUnitInfo> units;
};

Run train_tiny_gpt(const dtrain::FSDPOptions& options, int steps, double lr) {
  torch::manual_seed(13);
  dtrain::models::GPT model(tiny_gpt_config());
  auto fsdp = dtrain::fully_shard(model, world_ptr(), options);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(lr));
  Run run;
  for (int step = 0; step < steps; ++step) {
    const auto mine = ddp_test::local_part(token_batch(step % 5, 12), world());
    optimizer.zero_grad();
    auto loss = gpt_loss(fsdp(mine.inputs), mine.targets);
    loss.backward();
    optimizer.step();
    auto global = loss.detach().reshape({1});
    world().all_reduce(global, dtrain::ReduceOp::Avg)->wait();
    run.losses.push_back(global.item<double>());
  }
  for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32) << "fp32 master shards";
  run.weights = fsdp.full_state_dict(/*rank0_only=*/false);
  run.last = fsdp.last_step();
  run.units = fsdp.units();
  return run;
}

double max_weight_difference(const Run& a, const Run& b) {
  double worst = 0;
  for (const auto& [name, value] : a.weights)
    worst = std::max(worst, (value - b.weights.at(name)).abs().max().item<double>());
  return worst;
}

dtrain::FSDPOptions compressed(ParamCompression params, GradCompression grads) {
  dtrain::FSDPOptions options;
  options.compression.params = params;
  options.compression.grads = grads;
  return options;
}

// bf16 all-gathers (fp32 compute): 20 AdamW steps end with fp32 weights
// within 1e-2 of the uncompressed run's, element by element.
TEST(Training, Bf16ParamsFollowTheUncompressedWeights) {
  if (world().size() == 1) GTEST_SKIP() << "a one-rank group compresses nothing";
  const auto plain = train_tiny_gpt({}, 20, 1e-3);
  const auto bf16 = train_tiny_gpt(compressed(ParamCompression::BF16, GradCompression::None), 20, 1e-3);
  const double worst = max_weight_difference(plain, bf16);
  if (world().rank() == 0) std::cout << "bf16 params: largest weight difference after 20 steps " << worst << std::endl;
  EXPECT_LT(worst, 1e-2);
  EXPECT_GT(worst, 0.0) << "compression must actually change the arithmetic";
}

// Every rank computes with the decoded weights, the owner of a shard too:
// the ranks' losses agree, and the int8 runs still learn alongside the
// uncompressed one.
TEST(Training, Int8ParamsAndGradientsLearn) {
  if (world().size() == 1) GTEST_SKIP() << "a one-rank group compresses nothing";
  const auto plain = train_tiny_gpt({}, 30, 3e-3);
  for (auto grads : {GradCompression::Int8, GradCompression::BF16}) {
    const auto run = train_tiny_gpt(compressed(ParamCompression::Int8, grads), 30, 3e-3);
    if (world().rank() == 0)
      std::cout << "int8 params, " << dtrain::to_string(grads) << " grads: loss " << run.losses.front() << " -> "
                << run.losses.back() << " (uncompressed " << plain.losses.back() << ")" << std::endl;
    // Random tokens: the runs can only memorise the 5 batches (from ln 256 =
    // 5.55 down by about 0.4 in 30 steps); a compressed run makes at least
    // 80% of the uncompressed run's progress and ends within 2% of its loss.
    const double progress = plain.losses.front() - plain.losses.back();
    EXPECT_LT(run.losses.back(), run.losses.front() - 0.8 * progress);
    EXPECT_LT(std::abs(run.losses.back() - plain.losses.back()), 0.02 * plain.losses.back());
  }
  // The same model, int8 everywhere: a rank that used its exact shard
  // instead of the decoded one would drift from the others.
  const auto run = train_tiny_gpt(compressed(ParamCompression::Int8, GradCompression::Int8), 5, 3e-3);
  auto mine = torch::tensor(run.losses, torch::kDouble);
  auto first = mine.clone();
  world().broadcast(first, 0)->wait();
  EXPECT_TRUE(torch::equal(mine, first)) << "every rank sees the same losses";
}

TEST(Training, Fp8ParamsLearn) {
  if (world().size() == 1) GTEST_SKIP() << "a one-rank group compresses nothing";
  const auto plain = train_tiny_gpt({}, 30, 3e-3);
  const auto run = train_tiny_gpt(compressed(ParamCompression::FP8, GradCompression::BF16), 30, 3e-3);
  if (world().rank() == 0)
    std::cout << "fp8 params, bf16 grads: loss " << run.losses.front() << " -> " << run.losses.back()
              << " (uncompressed " << plain.losses.back() << ")" << std::endl;
  const double progress = plain.losses.front() - plain.losses.back();
  EXPECT_LT(run.losses.back(), run.losses.front() - 0.8 * progress);
  EXPECT_LT(std::abs(run.losses.back() - plain.losses.back()), 0.02 * plain.losses.back());
}

// ---------------------------------------------------------------- bytes

// What one rank hands to collectives in a step of a Full-sharded model, from
// the units' sizes alone: every unit gathered in forward and (but the root)
// again in backward; one reduction per unit; a unit's records are its
// shard at 4 (fp32), 2 (bf16) or 1 byte (int8, fp8) per element plus, for
// int8 and fp8, a 4-byte scale per block.
struct Expected {
  int64_t gather = 0, reduce = 0;
};
int64_t record(int bytes_per_element, bool scaled, int64_t shard, int64_t block) {
  return shard * bytes_per_element + (scaled ? 4 * ((shard + block - 1) / block) : 0);
}
int64_t param_record(const CollectiveCompression& c, int64_t shard) {
  switch (c.params) {
    case ParamCompression::None: return record(4, false, shard, c.block_size);
    case ParamCompression::BF16: return record(2, false, shard, c.block_size);
    default: return record(1, true, shard, c.block_size);
  }
}
int64_t grad_record(const CollectiveCompression& c, int64_t shard) {
  switch (c.grads) {
    case GradCompression::None: return record(4, false, shard, c.block_size);
    case GradCompression::BF16: return record(2, false, shard, c.block_size);
    default: return record(1, true, shard, c.block_size);
  }
}
Expected expected_bytes(const std::vector<dtrain::FSDPUnitInfo>& units,
                        const std::function<CollectiveCompression(size_t)>& compression_of, int G) {
  Expected e;
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].numel == 0) continue;
    const auto c = compression_of(u);
    e.gather += (u == 0 ? 1 : 2) * G * param_record(c, units[u].shard_numel);
    e.reduce += G * grad_record(c, units[u].shard_numel);
  }
  return e;
}
Expected expected_bytes(const std::vector<dtrain::FSDPUnitInfo>& units, const CollectiveCompression& c, int G) {
  return expected_bytes(units, [&](size_t) { return c; }, G);
}

TEST(Bytes, FallByTheRecordsFactor) {
  if (world().size() == 1) GTEST_SKIP() << "a one-rank group compresses nothing";
  const int G = world().size();
  const auto plain = train_tiny_gpt({}, 2, 1e-3);
  const auto e_plain = expected_bytes(plain.units, CollectiveCompression{}, G);
  EXPECT_EQ(plain.last.steps, 2);
  EXPECT_EQ(plain.last.all_gather_bytes, e_plain.gather);
  EXPECT_EQ(plain.last.reduce_scatter_bytes, e_plain.reduce);
  EXPECT_EQ(plain.last.all_gather_calls, 2 * static_cast<int64_t>(plain.units.size()) - 1);
  EXPECT_EQ(plain.last.reduce_scatter_calls, static_cast<int64_t>(plain.units.size()));

  for (auto [params, grads] : {std::pair{ParamCompression::BF16, GradCompression::BF16},
                               std::pair{ParamCompression::Int8, GradCompression::Int8},
                               std::pair{ParamCompression::FP8, GradCompression::Int8}}) {
    auto options = compressed(params, grads);
    const auto run = train_tiny_gpt(options, 2, 1e-3);
    const auto e = expected_bytes(run.units, options.compression, G);
    const std::string what = std::string(dtrain::to_string(params)) + "/" + dtrain::to_string(grads);
    EXPECT_EQ(run.last.all_gather_bytes, e.gather) << what;
    EXPECT_EQ(run.last.reduce_scatter_bytes, e.reduce) << what;
    const double gather_factor = static_cast<double>(run.last.all_gather_bytes) / plain.last.all_gather_bytes;
    const double reduce_factor = static_cast<double>(run.last.reduce_scatter_bytes) / plain.last.reduce_scatter_bytes;
    if (world().rank() == 0)
      std::cout << what << ": all-gather " << run.last.all_gather_bytes << " / " << plain.last.all_gather_bytes
                << " bytes = " << gather_factor << "x, reduce-scatter " << run.last.reduce_scatter_bytes << " / "
                << plain.last.reduce_scatter_bytes << " = " << reduce_factor << "x" << std::endl;
    if (params == ParamCompression::BF16) {
      // Two bytes per element, no scales: exactly half, padding included.
      EXPECT_EQ(2 * run.last.all_gather_bytes, plain.last.all_gather_bytes);
      EXPECT_EQ(2 * run.last.reduce_scatter_bytes, plain.last.reduce_scatter_bytes);
    } else {
      // (256 + 4) / 1024 = 0.254, plus a short last block's scale per shard.
      EXPECT_NEAR(gather_factor, 260.0 / 1024, 0.01) << what;
      EXPECT_NEAR(reduce_factor, 260.0 / 1024, 0.01) << what;
    }
  }
}

// The plan predicts what the engine counts (Full sharding, fp32 compute).
TEST(Bytes, PlanPredictsTheCounters) {
  if (world().size() == 1) GTEST_SKIP() << "a one-rank group compresses nothing";
  for (const auto& options : {dtrain::FSDPOptions{}, compressed(ParamCompression::Int8, GradCompression::BF16)}) {
    const auto run = train_tiny_gpt(options, 1, 1e-3);
    dtrain::plan::PlanOptions plan_options;
    plan_options.fsdp = options;
    plan_options.world_size = world().size();
    plan_options.rank = world().rank();
    const auto plan = dtrain::plan::make_plan(dtrain::plan::describe_gpt(tiny_gpt_config(), 6, torch::kFloat32),
                                              plan_options);
    int64_t gathers = 0, reductions = 0;
    for (const auto& c : plan.collectives) {
      if (c.op == "all_gather") gathers += c.payload_bytes;
      if (c.op == "reduce_scatter" || c.op == "all_to_all") reductions += c.payload_bytes;
    }
    EXPECT_EQ(gathers, run.last.all_gather_bytes) << dtrain::to_string(options.compression);
    EXPECT_EQ(reductions, run.last.reduce_scatter_bytes) << dtrain::to_string(options.compression);
  }
}

// Hybrid: the all-gather and the reduce-scatter inside a group are
// compressed; the all-reduce of the gradient shards across groups is not.
TEST(Bytes, HybridCompressesInsideTheGroupOnly) {
  if (world().size() != 4) GTEST_SKIP() << "needs 2 groups of 2";
  dtrain::FSDPOptions options = compressed(ParamCompression::BF16, GradCompression::BF16);
  options.strategy = Sharding::Hybrid;
  options.hybrid_group_size = 2;
  const auto run = train_tiny_gpt(options, 1, 1e-3);
  int64_t shards = 0;
  for (const auto& unit : run.units) shards += unit.numel > 0 ? unit.shard_numel : 0;
  EXPECT_EQ(run.last.replica_all_reduce_bytes, shards * 4) << "fp32 gradient shards across groups";
  EXPECT_EQ(run.last.reduce_scatter_bytes, expected_bytes(run.units, options.compression, 2).reduce);
}

// ---------------------------------------------------------------- options

TEST(Options, PerUnitOverridesWin) {
  if (world().size() == 1) GTEST_SKIP() << "a one-rank group compresses nothing";
  dtrain::FSDPOptions options = compressed(ParamCompression::Int8, GradCompression::Int8);
  // The root (embeddings) travels uncompressed; the blocks in int8.
  options.compression_by_unit[""] = CollectiveCompression{};
  const auto run = train_tiny_gpt(options, 1, 1e-3);
  const auto e = expected_bytes(
      run.units, [&](size_t u) { return u == 0 ? CollectiveCompression{} : options.compression; }, world().size());
  EXPECT_EQ(run.last.all_gather_bytes, e.gather);
  EXPECT_EQ(run.last.reduce_scatter_bytes, e.reduce);
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(Options, RefusedWithTheReason) {
  auto build = [](const dtrain::FSDPOptions& options) {
    torch::manual_seed(14);
    dtrain::models::GPT model(tiny_gpt_config());
    auto fsdp = dtrain::fully_shard(model, world_ptr(), options);
  };
  auto zero1 = compressed(ParamCompression::Int8, GradCompression::BF16);
  zero1.strategy = Sharding::OptimizerOnly;
  EXPECT_NE(error_of([&] { build(zero1); }).find("OptimizerOnly (zero1) all-reduces gradients"), std::string::npos);
  auto unknown = compressed(ParamCompression::Int8, GradCompression::None);
  unknown.compression_by_unit["blocks.9"] = CollectiveCompression{};
  EXPECT_NE(error_of([&] { build(unknown); }).find("names 'blocks.9', which is no unit"), std::string::npos);
  auto block = compressed(ParamCompression::Int8, GradCompression::None);
  block.compression.block_size = 0;
  EXPECT_NE(error_of([&] { build(block); }).find("block_size must be at least 1"), std::string::npos);
  // zero1 with parameter compression alone is fine.
  zero1.compression.grads = GradCompression::None;
  EXPECT_EQ(error_of([&] { build(zero1); }), "(no error)");
}

TEST(Options, ParsedFromTheFlag) {
  const auto c = dtrain::parse_collective_compression("params=int8,grads=bf16,block=128");
  EXPECT_EQ(c.params, ParamCompression::Int8);
  EXPECT_EQ(c.grads, GradCompression::BF16);
  EXPECT_EQ(c.block_size, 128);
  EXPECT_EQ(dtrain::to_string(c), "params=int8,grads=bf16,block=128");
  EXPECT_EQ(dtrain::parse_collective_compression("none"), CollectiveCompression{});
  EXPECT_NE(error_of([] { dtrain::parse_collective_compression("params=int4"); }).find("not one of none, bf16, int8, fp8"),
            std::string::npos);
  EXPECT_NE(error_of([] { dtrain::parse_collective_compression("grads=fp8"); }).find("grads=fp8 is not offered"),
            std::string::npos);
  EXPECT_NE(error_of([] { dtrain::parse_collective_compression("block=0"); }).find("block=0 must be"), std::string::npos);
  EXPECT_NE(error_of([] { dtrain::parse_collective_compression("int8"); }).find("'int8' is not key=value"),
            std::string::npos);
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
