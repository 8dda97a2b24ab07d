// GPT training throughput on one GPU (a probe, not a test: it prints a
// table and asserts nothing). A ~85M-parameter byte-level GPT (12 layers,
// width 768, context 1024), forward + backward + AdamW, measured side by side:
//   plain fp32      LibTorch alone, TF32 off
//   plain bf16      LibTorch alone, the whole model in bf16
//   FSDP Full bf16  dtrain::fully_shard at world size 1, bf16 compute,
//                   fp32 master weights and reduction
//   FSDP GradOp bf16
// Run under `dtrain launch -n 1 --backend c10d -- bench_gpt_cuda [batch] [steps]`.
#include <dtrain/comm.h>
#include <dtrain/fsdp.h>
#include <dtrain/models.h>

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

namespace {

dtrain::models::GPTConfig bench_config() {
  dtrain::models::GPTConfig config;
  config.vocab_size = 256;
  config.seq_len = 1024;
  config.n_layer = 12;
  config.n_embd = 768;
  config.n_head = 12;
  return config;
}

struct Result {
  double seconds_per_step = 0;
  double final_loss = 0;
};

// `step(tokens, targets)` runs one training step and returns the loss tensor.
Result measure(const std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>& step, int64_t batch,
               int steps, torch::Device device) {
  const auto config = bench_config();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  auto tokens = torch::randint(0, config.vocab_size, {batch, config.seq_len + 1}, generator).to(device);
  auto inputs = tokens.narrow(1, 0, config.seq_len);
  auto targets = tokens.narrow(1, 1, config.seq_len);
  for (int i = 0; i < 3; ++i) step(inputs, targets);  // warm-up: allocator, kernel selection
  torch::cuda::synchronize();
  const auto start = std::chrono::steady_clock::now();
  torch::Tensor loss;
  for (int i = 0; i < steps; ++i) loss = step(inputs, targets);
  torch::cuda::synchronize();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {seconds / steps, loss.item<double>()};
}

torch::Tensor gpt_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat32), targets.reshape({-1}));
}

}  // namespace

int main(int argc, char** argv) {
  auto world = dtrain::init(argc, argv);
  if (!torch::cuda::is_available()) {
    std::printf("bench_gpt_cuda: no CUDA device on this machine; nothing measured\n");
    return 0;
  }
  const int64_t batch = argc > 1 ? std::atoll(argv[1]) : 16;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 10;
  const torch::Device device(torch::kCUDA, 0);
  at::globalContext().setAllowTF32CuBLAS(false);
  const auto config = bench_config();
  const int64_t parameters = dtrain::models::GPTImpl::parameter_count(config);
  const double tokens_per_step = static_cast<double>(batch * config.seq_len);
  // 6 FLOP per parameter per token, plus causal attention's 6 * L * T * C
  // (QK^T and AV, forward and backward, half the square).
  const double flop_per_token = 6.0 * parameters + 6.0 * config.n_layer * config.seq_len * config.n_embd;

  std::printf("GPT %lld parameters (%lld layers, width %lld, context %lld), batch %lld, %d timed steps, world %d\n",
              static_cast<long long>(parameters), static_cast<long long>(config.n_layer),
              static_cast<long long>(config.n_embd), static_cast<long long>(config.seq_len),
              static_cast<long long>(batch), steps, world->size());
  std::printf("%-18s %12s %14s %10s %10s\n", "run", "ms/step", "tokens/s", "TFLOP/s", "loss");
  auto report = [&](const char* name, const Result& r) {
    const double tokens_per_second = tokens_per_step / r.seconds_per_step;
    std::printf("%-18s %12.1f %14.0f %10.1f %10.4f\n", name, r.seconds_per_step * 1e3, tokens_per_second,
                tokens_per_second * flop_per_token / 1e12, r.final_loss);
    std::fflush(stdout);
  };

  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    torch::manual_seed(1);
    dtrain::models::GPT model(config);
    model->to(device, dtype);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));
    auto result = measure(
        [&](const torch::Tensor& x, const torch::Tensor& y) {
          optimizer.zero_grad();
          auto loss = gpt_loss(model->forward(x), y);
          loss.backward();
          optimizer.step();
          return loss.detach();
        },
        batch, steps, device);
    report(dtype == torch::kFloat32 ? "plain fp32" : "plain bf16", result);
  }
  for (auto strategy : {dtrain::Sharding::Full, dtrain::Sharding::GradOp}) {
    torch::manual_seed(1);
    dtrain::models::GPT model(config);
    model->to(device);
    dtrain::FSDPOptions options;
    options.strategy = strategy;
    options.mixed_precision.param_dtype = torch::kBFloat16;
    auto fsdp = dtrain::fully_shard(model, world, options);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-4));
    auto result = measure(
        [&](const torch::Tensor& x, const torch::Tensor& y) {
          optimizer.zero_grad();
          auto loss = gpt_loss(fsdp(x), y);
          loss.backward();
          optimizer.step();
          return loss.detach();
        },
        batch, steps, device);
    report(strategy == dtrain::Sharding::Full ? "FSDP Full bf16" : "FSDP GradOp bf16", result);
  }
  return 0;
}
