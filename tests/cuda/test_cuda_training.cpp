// Training on a GPU through the c10d backend: DDP and FSDP (Full, GradOp,
// Hybrid) equal plain single-process CUDA training on the same global
// batches (every rank computes that reference itself), bf16 mixed precision
// tracks fp32 as on the CPU, and the memory accounting works with CUDA
// tensors around. Skips, saying why, on machines without a GPU.
//
// Any number of ranks (`dtrain launch -n N --backend c10d`): rank r runs on
// cuda:(LOCAL_RANK % GPUs). With a GPU per rank CUDA tensors go through NCCL;
// with ranks sharing a GPU (2 or 3 on a one-GPU machine) NCCL cannot run and
// they go through Gloo, staged in host memory, so the engines' streams,
// events and device guards meet real peers there too
// (DTRAIN_CUDA_BACKEND, Note [the CUDA engine] in src/comm/c10d/c10d_backend.cpp).
//
// fp32 stays fp32: TF32 is switched off for cuBLAS and cuDNN, so the only
// differences from the reference are summation order and atomics.
#include <dtrain/context_parallel.h>
#include <dtrain/float8.h>
#include <dtrain/ddp.h>
#include <dtrain/fsdp.h>
#include <dtrain/memory.h>
#include <dtrain/models.h>

#include "../common/multirank_gtest.h"
#include "../common/skip_exit_code.h"
#include "../ddp/ddp_test_support.h"
#include "../fsdp/fsdp_test_models.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

using dtrain::Sharding;
using dtrain::testing::world;
using dtrain::testing::world_ptr;

constexpr int kSteps = 10;
constexpr int64_t kGlobalBatch = 12;  // equal parts at 1, 2, 3, 4 and 6 ranks

enum class Model { MLP, GPT };
enum class Optimizer { AdamW, SGD };

// DTRAIN_CUDA_TESTS_ON_CPU=1 runs every case on the CPU instead: a check
// of the tests themselves on machines without a GPU.
bool on_cpu_instead() {
  const char* value = std::getenv("DTRAIN_CUDA_TESTS_ON_CPU");
  return value && std::string(value) == "1";
}

// cuda:(LOCAL_RANK % GPUs): more ranks than GPUs share them.
torch::Device device() {
  if (on_cpu_instead()) return torch::kCPU;
  const char* local = std::getenv("LOCAL_RANK");
  const int gpus = std::max(1, static_cast<int>(torch::cuda::device_count()));
  return {torch::kCUDA, static_cast<c10::DeviceIndex>((local ? std::atoi(local) : 0) % gpus)};
}

bool on_device(const torch::Tensor& t) { return t.device() == device(); }

class CudaTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!on_cpu_instead()) {
      // The same verdict on every rank, so every rank runs the same collectives.
      if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine";
      // Its name says which engine carries CUDA tensors: "c10d (gloo; cuda: nccl)".
      if (world().backend_name().rfind("c10d", 0) != 0) GTEST_SKIP() << "CUDA tensors need the c10d backend";
      at::globalContext().setAllowTF32CuBLAS(false);
      at::globalContext().setAllowTF32CuDNN(false);
    }
    static bool said = false;
    if (!said && world().rank() == 0)
      std::cout << "[setup] " << world().size() << " rank(s), rank 0 on " << device().str() << ", "
                << world().backend_name() << std::endl;
    said = true;
  }
};

ddp_test::Batch batch_for(Model model, int64_t step) {
  if (model == Model::MLP) return ddp_test::global_batch(step, kGlobalBatch);
  const int64_t t = fsdp_test::tiny_gpt_config().seq_len;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(700 + step);
  auto tokens = torch::randint(0, 256, {kGlobalBatch, t + 1}, generator);
  return {tokens.narrow(1, 0, t), tokens.narrow(1, 1, t)};
}

torch::Tensor loss_of(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (logits.dim() == 3) return torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  return torch::cross_entropy_loss(logits, targets);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(Optimizer kind, const std::vector<torch::Tensor>& params) {
  if (kind == Optimizer::SGD)
    return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01).weight_decay(0.01));
}

// Largest allowed parameter difference from plain training after kSteps.
// The GPT under AdamW gets the CPU equivalence test's bound (see tolerance()
// in tests/fsdp/test_fsdp_equivalence.cpp): elements whose gradient is
// O(1e-8) take full-size AdamW steps driven by rounding noise, and CUDA
// kernels with atomics (embedding backward) round differently run to run.
double tolerance(Model model, Optimizer optimizer) {
  if (model == Model::GPT && optimizer == Optimizer::AdamW) return 1e-4;
  return 1e-5;
}

// See freeze_qkv_biases in tests/fsdp/test_fsdp_equivalence.cpp.
void freeze_qkv_biases(torch::nn::Module& model) {
  for (auto& item : model.named_parameters())
    if (item.key().ends_with("qkv.bias")) item.value().set_requires_grad(false);
}

// The GPT's dropout (ActivationCheckpointingReplaysGpuDropout sets it).
double gpt_dropout = 0;

// A fresh model, the same on every call and every rank. (manual_seed seeds
// the GPU's generator too: dropout draws the same masks in every run.)
std::shared_ptr<torch::nn::Module> build(Model model) {
  torch::manual_seed(3);
  if (model == Model::MLP) return fsdp_test::make_mlp().ptr();
  auto config = fsdp_test::tiny_gpt_config();
  config.dropout = gpt_dropout;
  auto gpt = dtrain::models::GPT(config);
  freeze_qkv_biases(*gpt);
  return gpt.ptr();
}

struct Trained {
  std::vector<double> losses;                  // global loss per step
  std::map<std::string, torch::Tensor> params;  // full parameters, on the CPU
};

std::map<std::string, torch::Tensor> named_on_cpu(const torch::nn::Module& module) {
  std::map<std::string, torch::Tensor> result;
  for (const auto& item : module.named_parameters()) result[item.key()] = item.value().detach().cpu();
  return result;
}

double global_mean(double local) {
  auto value = torch::tensor({local}, torch::kDouble);
  world().all_reduce(value, dtrain::ReduceOp::Avg)->wait();
  return value.item<double>();
}

// Runs `steps` of training: `forward(inputs)` on this rank's part of each
// global batch (the whole batch when `whole_batch`).
template <class Forward>
std::vector<double> train(Model model, Optimizer kind, const std::vector<torch::Tensor>& params, Forward forward,
                          bool whole_batch) {
  auto optimizer = make_optimizer(kind, params);
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    const auto global = batch_for(model, step);
    const auto mine = whole_batch ? global : ddp_test::local_part(global, world());
    optimizer->zero_grad();
    torch::Tensor logits = forward(mine.inputs.to(device()));
    EXPECT_TRUE(on_device(logits)) << "step " << step;
    torch::Tensor loss = loss_of(logits, mine.targets.to(device()));
    loss.backward();
    optimizer->step();
    losses.push_back(whole_batch ? loss.item<double>() : global_mean(loss.item<double>()));
  }
  return losses;
}

torch::nn::Sequential as_mlp(const std::shared_ptr<torch::nn::Module>& module) {
  return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(module));
}
dtrain::models::GPT as_gpt(const std::shared_ptr<torch::nn::Module>& module) {
  return dtrain::models::GPT(std::dynamic_pointer_cast<dtrain::models::GPTImpl>(module));
}

Trained train_plain(Model model, Optimizer kind) {
  auto module = build(model);
  module->to(device());
  Trained result;
  if (model == Model::MLP) {
    auto mlp = as_mlp(module);
    result.losses =
        train(model, kind, mlp->parameters(), [&](const torch::Tensor& x) { return mlp->forward(x); }, true);
  } else {
    auto gpt = as_gpt(module);
    result.losses = train(model, kind, gpt->parameters(), [&](const torch::Tensor& x) { return gpt(x); }, true);
  }
  result.params = named_on_cpu(*module);
  return result;
}

template <class Holder>
Trained train_ddp_holder(Model model, Optimizer kind, Holder holder, const dtrain::DDPOptions& options) {
  auto ddp = dtrain::DistributedDataParallel(holder, world_ptr(), options);
  for (const auto& p : holder->parameters()) EXPECT_TRUE(on_device(p)) << "DDP keeps the parameters on the GPU";
  Trained result;
  result.losses = train(model, kind, holder->parameters(), [&](const torch::Tensor& x) { return ddp(x); }, false);
  result.params = named_on_cpu(*holder);
  return result;
}

Trained train_ddp(Model model, Optimizer kind, const dtrain::DDPOptions& options = {}) {
  auto module = build(model);
  module->to(device());
  if (model == Model::MLP) return train_ddp_holder(model, kind, as_mlp(module), options);
  return train_ddp_holder(model, kind, as_gpt(module), options);
}

template <class Holder>
Trained train_fsdp_holder(Model model, Optimizer kind, Holder holder, const dtrain::FSDPOptions& options) {
  auto fsdp = dtrain::fully_shard(holder, world_ptr(), options);
  for (const auto& p : holder->parameters()) EXPECT_TRUE(on_device(p)) << "the shards stay on the GPU";
  Trained result;
  result.losses = train(model, kind, holder->parameters(), [&](const torch::Tensor& x) { return fsdp(x); }, false);
  for (auto& [name, value] : fsdp.full_state_dict(/*rank0_only=*/false)) result.params[name] = value.cpu();
  return result;
}

Trained train_fsdp(Model model, Optimizer kind, const dtrain::FSDPOptions& options) {
  auto module = build(model);
  module->to(device());
  if (model == Model::MLP) return train_fsdp_holder(model, kind, as_mlp(module), options);
  return train_fsdp_holder(model, kind, as_gpt(module), options);
}

void expect_same_training(const Trained& reference, const Trained& got, double tolerance, const std::string& what) {
  ASSERT_EQ(reference.losses.size(), got.losses.size());
  for (size_t step = 0; step < got.losses.size(); ++step)
    EXPECT_NEAR(got.losses[step], reference.losses[step], 1e-5) << what << ", step " << step;
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, value] : reference.params) {
    auto it = got.params.find(name);
    if (it == got.params.end()) {
      ADD_FAILURE() << what << ": no parameter " << name;
      continue;
    }
    const double difference = (it->second.to(torch::kDouble) - value.to(torch::kDouble)).abs().max().item<double>();
    if (difference > worst) {
      worst = difference;
      worst_name = name;
    }
  }
  if (world().rank() == 0)
    std::cout << "[measured] " << what << ": largest parameter difference " << worst << " (" << worst_name
              << "), bound " << tolerance << std::endl;
  ::testing::Test::RecordProperty("max_abs_difference", std::to_string(worst));
  EXPECT_LE(worst, tolerance) << what << ": largest difference in " << worst_name;
}

std::string name_of(Model m) { return m == Model::MLP ? "MLP" : "GPT"; }
std::string name_of(Optimizer o) { return o == Optimizer::AdamW ? "AdamW" : "SGD"; }

TEST_F(CudaTraining, DDPMatchesPlainTraining) {
  for (auto [model, kind] : {std::pair{Model::MLP, Optimizer::AdamW}, std::pair{Model::GPT, Optimizer::AdamW},
                             std::pair{Model::GPT, Optimizer::SGD}}) {
    const std::string what = "DDP " + name_of(model) + " " + name_of(kind);
    expect_same_training(train_plain(model, kind), train_ddp(model, kind), tolerance(model, kind), what);
  }
}

// The default (above) issues collectives from communication streams of
// their own (Note [communication streams]); issued from the compute stream
// instead, training must be the same.
TEST_F(CudaTraining, CommunicationStreamsOffMatchPlainTraining) {
  dtrain::DDPOptions ddp;
  ddp.comm_streams = false;
  expect_same_training(train_plain(Model::GPT, Optimizer::AdamW), train_ddp(Model::GPT, Optimizer::AdamW, ddp),
                       tolerance(Model::GPT, Optimizer::AdamW), "DDP GPT AdamW, streams off");
  for (auto strategy : {Sharding::Full, Sharding::GradOp}) {
    dtrain::FSDPOptions options;
    options.strategy = strategy;
    options.comm_streams = false;
    expect_same_training(train_plain(Model::GPT, Optimizer::AdamW), train_fsdp(Model::GPT, Optimizer::AdamW, options),
                         tolerance(Model::GPT, Optimizer::AdamW),
                         std::string("FSDP ") + dtrain::to_string(strategy) + " GPT AdamW, streams off");
  }
}

// Hybrid's sharding group: the smallest proper divisor of the world size, so
// that groups shard and replicate across each other (2 x 2 at 4 ranks); at a
// prime world size (2, 3) groups of one rank, so the gradients are
// all-reduced across all ranks and each shard group is a split of one.
int hybrid_group_size(int world_size) {
  for (int group = 2; group < world_size; ++group)
    if (world_size % group == 0) return group;
  return 1;
}

TEST_F(CudaTraining, FSDPMatchesPlainTraining) {
  for (auto strategy : {Sharding::Full, Sharding::GradOp, Sharding::Hybrid}) {
    for (auto [model, kind] : {std::pair{Model::MLP, Optimizer::AdamW}, std::pair{Model::GPT, Optimizer::AdamW},
                               std::pair{Model::GPT, Optimizer::SGD}}) {
      dtrain::FSDPOptions options;
      options.strategy = strategy;
      options.hybrid_group_size = hybrid_group_size(world().size());
      std::string what = std::string("FSDP ") + dtrain::to_string(strategy);
      if (strategy == Sharding::Hybrid) what += " (groups of " + std::to_string(options.hybrid_group_size) + ")";
      what += " " + name_of(model) + " " + name_of(kind);
      expect_same_training(train_plain(model, kind), train_fsdp(model, kind, options), tolerance(model, kind), what);
    }
  }
}

// Activation checkpointing recomputes each block in its backward: with
// dropout on a GPU the recompute must draw the masks the forward drew, from
// the GPU's generator (src/fsdp/activation_checkpoint.cpp restores its state
// as well as the CPU's). Then training with it equals training without it;
// with other masks the gradients would differ from the first step.
TEST_F(CudaTraining, ActivationCheckpointingReplaysGpuDropout) {
  gpt_dropout = 0.2;
  dtrain::FSDPOptions options;
  const Trained without = train_fsdp(Model::GPT, Optimizer::SGD, options);
  options.activation_checkpointing = true;
  const Trained with = train_fsdp(Model::GPT, Optimizer::SGD, options);
  gpt_dropout = 0;
  expect_same_training(without, with, 1e-5, "FSDP Full GPT with dropout 0.2, activation checkpointing on vs off");
}

// The CPU test's check (MixedPrecision.Bf16TracksFp32 in
// tests/fsdp/test_fsdp_features.cpp) on the GPU: bf16 compute and
// all-gather, fp32 reduction and master weights; the loss follows the fp32
// run within 0.02 over 20 steps.
TEST_F(CudaTraining, Bf16MixedPrecisionTracksFp32) {
  std::vector<std::vector<double>> losses(2);
  for (int run = 0; run < 2; ++run) {
    torch::manual_seed(4);
    dtrain::models::GPT model(fsdp_test::tiny_gpt_config());
    model->to(device());
    dtrain::FSDPOptions options;
    if (run == 1) options.mixed_precision.param_dtype = torch::kBFloat16;
    auto fsdp = dtrain::fully_shard(model, world_ptr(), options);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
    for (int step = 0; step < 20; ++step) {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(900 + step % 4);
      const int64_t t = fsdp_test::tiny_gpt_config().seq_len;
      auto tokens = torch::randint(0, 256, {kGlobalBatch, t + 1}, generator);
      const auto mine = ddp_test::local_part({tokens.narrow(1, 0, t), tokens.narrow(1, 1, t)}, world());
      optimizer.zero_grad();
      auto logits = fsdp(mine.inputs.to(device()));
      EXPECT_EQ(logits.scalar_type(), torch::kFloat32) << "output_dtype";
      EXPECT_TRUE(on_device(logits));
      auto loss = loss_of(logits, mine.targets.to(device()));
      loss.backward();
      optimizer.step();
      losses[run].push_back(global_mean(loss.item<double>()));
    }
    for (const auto& p : model->parameters()) {
      EXPECT_EQ(p.scalar_type(), torch::kFloat32) << "fp32 master shards";
      EXPECT_TRUE(on_device(p));
    }
  }
  double worst = 0;
  for (size_t i = 0; i < losses[0].size(); ++i) worst = std::max(worst, std::abs(losses[0][i] - losses[1][i]));
  if (world().rank() == 0)
    std::cout << "[measured] bf16 vs fp32 loss on " << device().str() << ": first " << losses[1].front() << " vs "
              << losses[0].front() << ", last " << losses[1].back() << " vs " << losses[0].back() << ", largest gap "
              << worst << std::endl;
  EXPECT_LT(worst, 0.02);
  EXPECT_GT(worst, 0.0) << "bf16 must actually change the arithmetic";
  EXPECT_LT(losses[1].back(), losses[1].front() - 0.1) << "bf16 training makes progress";
}

// Last on purpose: the tracking allocator stays installed for the rest of
// the process. It counts CPU tensors only; CUDA bytes must not show up.
TEST_F(CudaTraining, MemoryAccountingWithCudaTensors) {
  dtrain::memory::install_tracking_allocator();
  EXPECT_TRUE(dtrain::memory::tracking_allocator_installed());
  dtrain::memory::reset_peak();
  const int64_t before = dtrain::memory::live_bytes();
  auto on_gpu = torch::ones({64 << 20}, torch::TensorOptions(torch::kUInt8).device(device()));  // 64 MiB
  if (!on_cpu_instead()) {
    EXPECT_LT(dtrain::memory::live_bytes() - before, 1 << 20) << "CUDA bytes counted as CPU bytes";
  }
  auto copy = on_gpu.narrow(0, 0, 1 << 20).clone().cpu();  // 1 MiB of CPU bytes, tracked
  EXPECT_GE(dtrain::memory::live_bytes() - before, 1 << 20);
  EXPECT_EQ(copy.sum().item<int64_t>(), 1 << 20);
  EXPECT_GE(dtrain::memory::peak_bytes(), dtrain::memory::live_bytes());

  for (auto strategy : {Sharding::Full, Sharding::GradOp}) {
    torch::manual_seed(5);
    dtrain::models::GPT model(fsdp_test::tiny_gpt_config());
    model->to(device());
    int64_t total = 0;
    for (const auto& p : model->parameters()) total += p.numel();
    dtrain::FSDPOptions options;
    options.strategy = strategy;
    options.mixed_precision.param_dtype = torch::kBFloat16;  // gathered storage apart from the shards
    auto fsdp = dtrain::fully_shard(model, world_ptr(), options);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
    const auto token_options = torch::TensorOptions(torch::kLong).device(device());
    auto tokens = torch::randint(0, 256, {4, fsdp_test::tiny_gpt_config().seq_len}, token_options);
    loss_of(fsdp(tokens), tokens).backward();
    optimizer.step();
    const int64_t bytes = fsdp.sharded_parameter_bytes();  // fp32 shards + their gradients
    int64_t largest_unit = 0;
    for (const auto& unit : fsdp.units()) largest_unit = std::max(largest_unit, unit.padded_numel);
    const int64_t expected = total * 4 * 2 / world().size();
    EXPECT_GE(bytes, expected - largest_unit * 8) << dtrain::to_string(strategy);
    EXPECT_LE(bytes, expected + largest_unit * 8) << dtrain::to_string(strategy);
    if (world().rank() == 0)
      std::cout << "[measured] " << dtrain::to_string(strategy) << ": sharded_parameter_bytes " << bytes
                << " (parameters " << total << "), CPU live " << dtrain::memory::live_bytes() << ", CPU peak "
                << dtrain::memory::peak_bytes() << ", peak RSS " << dtrain::memory::peak_rss_bytes() << std::endl;
  }
  EXPECT_GT(dtrain::memory::peak_rss_bytes(), 0);
}

// Ring attention's pairs on the device's kernel (src/cp/pair_attention.cpp:
// the memory-efficient CUDA kernel; on the CPU instead, the flash kernel)
// against full causal attention on every rank, forward and backward, over a
// ring of the world's ranks: at 1 rank a ring of one still runs a diagonal
// pair and a full one and merges them. dtrain train refuses --cp on a GPU
// until this has passed there (src/train/check_config.cpp).
TEST_F(CudaTraining, RingAttentionPairsOnTheDeviceEqualFullAttention) {
  const int n = world().size(), r = world().rank();
  const dtrain::cp::Ring ring = dtrain::cp::make_ring(world_ptr());
  // Chunks of 32 and of 20 tokens (the CUDA kernel's log-sum-exp then padded).
  for (const auto& [kind, length] : std::vector<std::pair<torch::ScalarType, int64_t>>{
           {torch::kFloat, 32}, {torch::kBFloat16, 32}, {torch::kFloat, 20}, {torch::kBFloat16, 20}}) {
    const torch::ScalarType dtype = kind;
    const int64_t chunk = length;
    const int64_t B = 2, H = 4, T = 2 * chunk * n, D = 32;
    torch::manual_seed(7);
    const auto on = torch::TensorOptions().device(device());
    const torch::Tensor q = torch::randn({B, H, T, D}, on).to(dtype).requires_grad_();
    const torch::Tensor k = torch::randn({B, H, T, D}, on).to(dtype).requires_grad_();
    const torch::Tensor v = torch::randn({B, H, T, D}, on).to(dtype).requires_grad_();
    const torch::Tensor weights = torch::randn({B, H, T, D}, on).to(dtype);
    const torch::Tensor full =
        at::scaled_dot_product_attention(q.to(torch::kFloat), k.to(torch::kFloat), v.to(torch::kFloat), {}, 0.0, true);
    (full * weights.to(torch::kFloat)).sum().backward();
    const auto shard = [&](const torch::Tensor& x) { return dtrain::cp::shard_sequence(x, 2, n, r); };
    const torch::Tensor q_mine = shard(q.detach()).requires_grad_(), k_mine = shard(k.detach()).requires_grad_(),
                        v_mine = shard(v.detach()).requires_grad_();
    const torch::Tensor out = dtrain::cp::ring_attention(q_mine, k_mine, v_mine, ring);
    EXPECT_TRUE(on_device(out));
    (out * shard(weights)).sum().to(torch::kFloat).backward();
    const double tolerance = dtype == torch::kFloat ? 1e-4 : 3e-2;
    const auto expect_close = [&](const torch::Tensor& got, const torch::Tensor& want, const char* what) {
      const double error = (got.to(torch::kFloat) - want.to(torch::kFloat)).abs().max().item<double>();
      EXPECT_LT(error, tolerance) << what << " (" << (dtype == torch::kFloat ? "fp32" : "bf16") << ", chunks of "
                                  << chunk << ", rank " << r << " of " << n << ")";
    };
    expect_close(out, shard(full), "output");
    expect_close(q_mine.grad(), shard(q.grad()), "dq");
    expect_close(k_mine.grad(), shard(k.grad()), "dk");
    expect_close(v_mine.grad(), shard(v.grad()), "dv");
  }
}

// --fp8 on the device (issue 41, dtrain/float8.h): the casts give the CPU's
// codes and scales, and at::_scaled_mm's products and gradients equal the
// emulation's (fp32 products of the same codes) within the kernel's
// accumulation, for both recipes. Skipped where the GPU has no fp8 kernels.
TEST_F(CudaTraining, Float8KernelsOnTheDeviceEqualTheEmulation) {
  torch::manual_seed(8);
  const auto x_cpu = torch::randn({37, 64}), w_cpu = torch::randn({48, 64}) * 0.1, go_cpu = torch::randn({37, 48});
  const auto cast_here = dtrain::float8_cast(x_cpu.to(device()), torch::kFloat8_e4m3fn, 1);
  const auto cast_cpu = dtrain::float8_cast(x_cpu, torch::kFloat8_e4m3fn, 1);
  EXPECT_TRUE(torch::equal(cast_here.data.cpu().view(torch::kUInt8), cast_cpu.data.view(torch::kUInt8)));
  EXPECT_TRUE(torch::equal(cast_here.inverse_scale.cpu(), cast_cpu.inverse_scale));
  const auto close = [](const torch::Tensor& got, const torch::Tensor& want, const std::string& what) {
    const auto g = got.cpu().to(torch::kFloat), w = want.cpu().to(torch::kFloat);
    const double error = (g - w).abs().max().item<double>(), scale = w.abs().max().item<double>();
    EXPECT_LE(error, scale / 64) << what;  // a few bf16 roundings, and fast accumulation in forward
  };
  for (const auto scaling : {dtrain::Float8Scaling::Tensorwise, dtrain::Float8Scaling::Rowwise}) {
    const std::string name = dtrain::float8_scaling_name(scaling);
    std::vector<torch::Tensor> outputs;
    for (const auto kernel : {dtrain::Float8Kernel::ScaledMM, dtrain::Float8Kernel::Emulated}) {
      const auto x = x_cpu.to(device()).to(torch::kBFloat16).requires_grad_();
      const auto w = w_cpu.to(device()).to(torch::kBFloat16).requires_grad_();
      torch::Tensor y;
      try {
        y = dtrain::float8_linear(x, w, {}, scaling, kernel);
      } catch (const std::runtime_error& error) {
        // LibTorch's refusal of a GPU without fp8 kernels, and nothing else.
        if (std::string(error.what()).find("is only supported on CUDA devices with compute capability") !=
            std::string::npos)
          GTEST_SKIP() << "no fp8 kernels on this GPU: " << error.what();
        throw;
      }
      y.backward(go_cpu.to(device()).to(torch::kBFloat16));
      EXPECT_TRUE(on_device(y));
      outputs.insert(outputs.end(), {y.detach(), x.grad(), w.grad()});
    }
    close(outputs[0], outputs[3], name + " output");
    close(outputs[1], outputs[4], name + " input gradient");
    close(outputs[2], outputs[5], name + " weight gradient");
  }
}

}  // namespace

int main(int argc, char** argv) {
  return dtrain::testing::skip_exit_code_if_all_skipped(dtrain::testing::run_multirank_tests(argc, argv));
}
