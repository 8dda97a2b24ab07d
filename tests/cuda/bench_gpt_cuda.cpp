// Plain-LibTorch GPT (or Llama) training throughput on one GPU: the baseline that
// `dtrain train --strategy single|ddp|fsdp|zero2` is measured against
// (scripts/device/gpu_runs.sh, bench/gpu_report.py). A probe, not a test.
//
// The same model and the same step as `dtrain train --model gpt|llama
// --optimizer adamw` at one rank, with no dtrain engine in the way: the GPT
// or Llama dtrain builds from these flags (train::gpt_config,
// train::llama_config: --kv-heads, --ffn-dim), cross-entropy on fp32
// logits, AdamW with dtrain's defaults (lr 1e-3, betas 0.9/0.999, eps 1e-8,
// weight decay 0.01; the lr held constant), seed 0, TF32 on. The precision
// policy is dtrain's (dtrain/mixed_precision.h; src/ddp/compute_copies.h):
//   bf16  fp32 master weights and AdamW state; every step the parameters are
//         cast afresh into bf16 compute copies, forward and backward run in
//         bf16, and the bf16 gradients become the masters' fp32 gradients
//   none  fp32 throughout (TF32 matmuls with --tf32 on)
// Steps are timed one by one, the device synchronised at each boundary;
// tokens/s is of the median timed step. MFU counts dtrain's model FLOPs
// (train::model_flops_per_unit: 6 per matrix-product parameter plus 12 L T C per token) against
// --peak-tflops, else dtrain's cached or measured bf16 (fp32) GEMM peak
// (train::peak_flops, $DTRAIN_CACHE_DIR). Memory: the CUDA caching
// allocator's allocated and reserved peaks over the steps (reset once the
// model is on the device, as dtrain train does).
//
// Output: a human line, then one JSON line ({"bench": "bench_gpt_cuda", ...}).
// Exit 2 on a bad flag, 77 ("SKIPPED: no GPU") with --device cuda and no GPU.
//   bench_gpt_cuda [--model gpt|llama] [--kv-heads N] [--ffn-dim N]
//                  [--gpt-layers 12] [--gpt-dim 768] [--gpt-heads 12] [--seq-len 1024]
//                  [--vocab-size 256] [--batch-size 16] [--steps 10] [--warmup-steps 2]
//                  [--mixed-precision bf16|none] [--tf32 on|off] [--peak-tflops X] [--device cuda|cpu]
#include <dtrain/models.h>
#include <dtrain/train.h>

#include "train/cuda_runtime.h"
#include "train/builtin_models.h"
#include "train/model.h"
#include "train/peak_flops.h"

#include <ATen/Context.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr const char* kUsage =
    "usage: bench_gpt_cuda [--model gpt|llama] [--kv-heads N] [--ffn-dim N] [--gpt-layers N] [--gpt-dim N] [--gpt-heads N] [--seq-len N] [--vocab-size N]\n"
    "                      [--batch-size N] [--steps N] [--warmup-steps N] [--mixed-precision bf16|none]\n"
    "                      [--tf32 on|off] [--peak-tflops X] [--device cuda|cpu]\n"
    "  defaults: 12 layers, width 768, 12 heads, context 1024, vocabulary 256, batch 16, 10 timed steps\n"
    "  after 2 untimed ones, bf16, TF32 on, the peak from dtrain's GEMM probe (cached), cuda\n";

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "bench_gpt_cuda: %s\n%s", why.c_str(), kUsage);
  std::exit(2);
}

struct Options {
  dtrain::TrainConfig config;  // the model, precision and peak, as dtrain train holds them
  int64_t warmup_steps = 2;
  std::string device = "cuda";
};

int64_t positive(const std::string& flag, const std::string& value, bool zero_ok = false) {
  size_t used = 0;
  int64_t number = -1;
  try {
    number = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || number < (zero_ok ? 0 : 1))
    usage_error(flag + " takes a " + (zero_ok ? "non-negative" : "positive") + " integer, got '" + value + "'");
  return number;
}

Options parse(int argc, char** argv) {
  Options o;
  auto& c = o.config;
  c.model = "gpt";
  c.optimizer = "adamw";
  c.gpt_layers = 12, c.gpt_dim = 768, c.gpt_heads = 12, c.seq_len = 1024, c.vocab_size = 256;
  c.batch_size = 16, c.steps = 10, c.mixed_precision = "bf16", c.tf32 = true;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (const auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      usage_error(flag.rfind("--", 0) == 0 ? flag + " needs a value" : "unexpected argument '" + flag + "'");
    }
    if (flag == "--model" && (value == "gpt" || value == "llama")) c.model = value;
    else if (flag == "--kv-heads") c.kv_heads = positive(flag, value);
    else if (flag == "--ffn-dim") c.ffn_dim = positive(flag, value);
    else if (flag == "--gpt-layers") c.gpt_layers = positive(flag, value);
    else if (flag == "--gpt-dim") c.gpt_dim = positive(flag, value);
    else if (flag == "--gpt-heads") c.gpt_heads = positive(flag, value);
    else if (flag == "--seq-len") c.seq_len = positive(flag, value);
    else if (flag == "--vocab-size") c.vocab_size = positive(flag, value);
    else if (flag == "--batch-size") c.batch_size = positive(flag, value);
    else if (flag == "--steps") c.steps = positive(flag, value);
    else if (flag == "--warmup-steps") o.warmup_steps = positive(flag, value, true);
    else if (flag == "--mixed-precision" && (value == "bf16" || value == "none")) c.mixed_precision = value;
    else if (flag == "--tf32" && (value == "on" || value == "off")) c.tf32 = value == "on";
    else if (flag == "--device" && (value == "cuda" || value == "cpu")) o.device = value;
    else if (flag == "--peak-tflops") {
      char* end = nullptr;
      c.peak_tflops = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(c.peak_tflops >= 0))
        usage_error("--peak-tflops takes a non-negative number, got '" + value + "'");
    } else if (flag == "--mixed-precision" || flag == "--tf32" || flag == "--device" || flag == "--model") {
      usage_error("bad value '" + value + "' for " + flag);
    } else {
      usage_error("unknown flag '" + flag + "'");
    }
  }
  if (c.gpt_dim % c.gpt_heads != 0)
    usage_error("--gpt-heads " + std::to_string(c.gpt_heads) + " must divide --gpt-dim " + std::to_string(c.gpt_dim));
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse(argc, argv);
  const dtrain::TrainConfig& config = options.config;
  const bool cuda = options.device == "cuda";
  if (cuda && !torch::cuda::is_available()) {
    std::printf("SKIPPED: no GPU (bench_gpt_cuda measures nothing without a CUDA device)\n");
    return 77;
  }
  const torch::Device device = cuda ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  const auto sync = [&] {
    if (cuda) dtrain::train::cuda::synchronize(0);
  };
  const bool bf16 = config.mixed_precision == "bf16";
  at::globalContext().setAllowTF32CuBLAS(config.tf32);  // as dtrain train's --tf32
  at::globalContext().setAllowTF32CuDNN(config.tf32);

  torch::manual_seed(0);  // dtrain train's default --seed
  // The model and its forward, as dtrain train builds it.
  std::shared_ptr<torch::nn::Module> model;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  if (config.model == "llama") {
    dtrain::models::Llama llama(dtrain::train::llama_config(config));
    model = llama.ptr();
    forward = [llama](const torch::Tensor& x) mutable { return llama->forward(x); };
  } else {
    dtrain::models::GPT gpt(dtrain::train::gpt_config(config));
    model = gpt.ptr();
    forward = [gpt](const torch::Tensor& x) mutable { return gpt->forward(x); };
  }
  model->to(device);
  model->train();
  const int64_t parameters = dtrain::models::parameter_count(*model);
  // bf16: the parameters become the compute copies; `masters` keep their fp32 storage.
  std::vector<torch::Tensor> params = model->parameters(), masters;
  for (auto& p : params) {
    if (!bf16) {
      masters.push_back(p);
      continue;
    }
    auto master = p.detach();
    master.requires_grad_(true);
    p.set_data(torch::empty_like(master, master.options().dtype(torch::kBFloat16)));
    masters.push_back(master);
  }
  torch::optim::AdamW optimizer(
      masters, torch::optim::AdamWOptions(1e-3).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.01));

  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  const auto tokens = torch::randint(0, config.vocab_size, {config.batch_size, config.seq_len + 1}, generator).to(device);
  const auto inputs = tokens.narrow(1, 0, config.seq_len), targets = tokens.narrow(1, 1, config.seq_len).reshape({-1});
  auto step = [&] {
    optimizer.zero_grad();
    if (bf16) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters[i]);
    }
    const auto logits = forward(inputs).to(torch::kFloat32);  // dtrain's output_dtype
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets);
    loss.backward();
    if (bf16)
      for (size_t i = 0; i < params.size(); ++i) {
        if (!params[i].grad().defined()) continue;
        masters[i].mutable_grad() = params[i].grad().to(torch::kFloat32);
        params[i].mutable_grad().reset();
      }
    optimizer.step();
    return loss.detach();
  };

  if (cuda) dtrain::train::cuda::reset_memory_peaks(0);
  for (int64_t i = 0; i < options.warmup_steps; ++i) step();
  std::vector<double> seconds;
  torch::Tensor loss;
  sync();
  for (int64_t i = 0; i < config.steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    loss = step();
    sync();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const double final_loss = loss.item<double>();
  double total = 0;
  for (double s : seconds) total += s;
  auto sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  const auto peaks = cuda ? dtrain::train::cuda::memory_peaks(0) : dtrain::train::cuda::MemoryPeaks{};

  const double tokens_per_step = static_cast<double>(config.batch_size * config.seq_len);
  const double tokens_per_s = tokens_per_step / median;
  const double flops_per_token = dtrain::train::model_flops_per_unit(config, parameters);
  const auto peak = dtrain::train::peak_flops(config, device, bf16 ? torch::kBFloat16 : torch::kFloat32);
  const double model_flops = tokens_per_s * flops_per_token;
  const double mfu = peak.flops > 0 ? model_flops / peak.flops : 0;
  const std::string name = cuda ? dtrain::train::cuda::device_name(0) : "cpu";

  std::printf("bench_gpt_cuda: plain LibTorch %s %.2fM (L%lld d%lld h%lld T%lld V%lld), batch %lld, %s, %s: "
              "%.1f ms/step, %.0f tokens/s, %.1f TFLOP/s, MFU %.1f%% of %.0f TFLOP/s (%s), "
              "CUDA peak allocated %.2f GiB, reserved %.2f GiB (0 off CUDA), loss %.4f\n",
              config.model == "llama" ? "Llama" : "GPT", parameters / 1e6, static_cast<long long>(config.gpt_layers), static_cast<long long>(config.gpt_dim),
              static_cast<long long>(config.gpt_heads), static_cast<long long>(config.seq_len),
              static_cast<long long>(config.vocab_size), static_cast<long long>(config.batch_size),
              config.mixed_precision.c_str(), name.c_str(), median * 1e3, tokens_per_s, model_flops / 1e12,
              100 * mfu, peak.flops / 1e12, peak.source.c_str(), peaks.allocated / 1073741824.0,
              peaks.reserved / 1073741824.0, final_loss);
  nlohmann::ordered_json line{{"bench", "bench_gpt_cuda"}, {"model", config.model}, {"parameters", parameters},
                              {"gpt_layers", config.gpt_layers}, {"gpt_dim", config.gpt_dim},
                              {"gpt_heads", config.gpt_heads}, {"kv_heads", config.kv_heads}, {"seq_len", config.seq_len},
                              {"vocab_size", config.vocab_size}, {"batch_size", config.batch_size},
                              {"mixed_precision", config.mixed_precision}, {"tf32", config.tf32},
                              {"optimizer", "adamw"}, {"warmup_steps", options.warmup_steps},
                              {"steps", config.steps}, {"step_time_s", median},
                              {"step_time_mean_s", total / static_cast<double>(n)}, {"tokens_per_s", tokens_per_s},
                              {"flops_per_token", flops_per_token}, {"model_tflops", model_flops / 1e12},
                              {"peak_tflops", peak.flops / 1e12}, {"peak_flops_source", peak.source},
                              {"mfu", mfu}, {"loss", final_loss}, {"device", device.str()}, {"device_name", name}};
  if (cuda) {
    line["cuda_allocated_peak_bytes"] = peaks.allocated;
    line["cuda_reserved_peak_bytes"] = peaks.reserved;
  }
  std::printf("%s\n", line.dump().c_str());  // NaN and infinities as null
  return 0;
}
