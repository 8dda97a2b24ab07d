#include "train/peak_flops.h"
#include "train/machine_cache.h"

#include "dtrain/model_spec.h"
#include "dtrain/train.h"
#include "train/cuda_runtime.h"
#include "common/timing.h"

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace dtrain::train {
namespace fs = std::filesystem;
namespace {

// What the measurement depends on: the device, the dtype, and on the CPU
// the threads a rank computes with.
std::string cache_key(const TrainConfig& config, const torch::Device& device, torch::ScalarType dtype) {
  std::string key = device.is_cuda() ? cuda::device_name(device.index()) : cpu_model();
  key += std::string(" ") + c10::toString(dtype);
  if (device.is_cuda() && dtype == torch::kFloat32) key += config.tf32 ? " tf32" : " no-tf32";
  if (!device.is_cuda()) key += " threads=" + std::to_string(at::get_num_threads());
  return key;
}

struct Probe {
  double flops = 0;
  bool cores_busy = false;  // CPU: another process took a share of this one's cores
};

double process_cpu_seconds() {
  timespec now{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// The side of the CPU's probe: 1024, or less where a multiply of that size
// would take over about 50 ms. A dtype without fast CPU kernels (bf16
// without AVX-512 BF16 runs at about 1/50 of fp32 here) made the fixed 1024
// probe take a minute, and every bf16 run repeated it, since its steps then
// beat the measured peak and the cache entry was dropped.
int64_t cpu_probe_side(const torch::TensorOptions& options) {
  constexpr int64_t kSmall = 128;
  const auto a = torch::randn({kSmall, kSmall}, options), b = torch::randn({kSmall, kSmall}, options);
  auto c = torch::mm(a, b);  // warm up
  const auto start = SteadyClock::now();
  torch::mm_out(c, a, b);
  const double rate = 2.0 * static_cast<double>(kSmall * kSmall * kSmall) / std::max(seconds_since(start), 1e-9);
  const auto side = static_cast<int64_t>(std::cbrt(0.05 * rate / 2.0));
  return std::clamp<int64_t>(side / 64 * 64, kSmall, 1024);
}

// The best rate of a square matrix product in `dtype`, large enough to
// reach the device's steady state (n = 8192 on a GPU, up to 1024 on the CPU).
Probe measure(const torch::Device& device, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions().device(device).dtype(dtype);
  const int64_t n = device.is_cuda() ? 8192 : cpu_probe_side(options);
  const int repeats = device.is_cuda() ? 20 : 3;
  const auto a = torch::randn({n, n}, options), b = torch::randn({n, n}, options);
  auto c = torch::empty({n, n}, options);
  const auto sync = [&] {
    if (device.is_cuda()) cuda::synchronize(device.index());
  };
  torch::mm_out(c, a, b);  // warm up: kernels chosen, memory in place
  sync();
  double best = 1e30, best_busy_share = 0;
  for (int round = 0; round < (device.is_cuda() ? 3 : 5); ++round) {
    const double cpu_before = process_cpu_seconds();
    const auto start = SteadyClock::now();
    for (int i = 0; i < repeats; ++i) torch::mm_out(c, a, b);
    sync();
    const double wall = seconds_since(start);
    if (wall / repeats < best) {
      best = wall / repeats;
      // The share of the round this process ran on each of its threads' cores.
      best_busy_share = (process_cpu_seconds() - cpu_before) / (wall * std::max(1, at::get_num_threads()));
    }
  }
  return {2.0 * static_cast<double>(n * n * n) / best, !device.is_cuda() && best_busy_share < 0.85};
}

}  // namespace

double model_flops_per_unit(const TrainConfig& config, int64_t parameters) {
  const ModelSpec& spec = find_model(config.model);
  return spec.flops_per_unit ? spec.flops_per_unit(config, parameters) : 0;
}

PeakFlops peak_flops(const TrainConfig& config, const torch::Device& device, torch::ScalarType dtype) {
  if (config.peak_tflops > 0) return {config.peak_tflops * 1e12, "--peak-tflops"};
  const fs::path file = machine_cache_file("peak_flops.json");
  const std::string key = cache_key(config, device, dtype);
  if (!file.empty()) {
    const auto cached = read_machine_cache(file);
    if (auto it = cached.find(key); it != cached.end() && it->is_number() && it->get<double>() > 0)
      return {it->get<double>() * 1e12, "cached in " + file.string()};
  }
  const Probe probe = measure(device, dtype);
  if (probe.cores_busy) return {probe.flops, "measured while the cores were busy, not cached"};
  if (!file.empty()) {
    auto cached = read_machine_cache(file);
    cached[key] = probe.flops / 1e12;
    write_machine_cache(file, cached);
  }
  return {probe.flops, "measured"};
}

std::string format_flops(double flops_per_s) {
  const bool tera = flops_per_s >= 1e12;
  const double value = flops_per_s / (tera ? 1e12 : 1e9);
  char text[48];
  std::snprintf(text, sizeof(text), value >= 100 ? "%.0f %s" : value >= 10 ? "%.1f %s" : "%.2f %s", value,
                tera ? "TFLOP/s" : "GFLOP/s");
  return text;
}

void forget_cached_peak(const TrainConfig& config, const torch::Device& device, torch::ScalarType dtype) {
  const fs::path file = machine_cache_file("peak_flops.json");
  if (file.empty()) return;
  auto cached = read_machine_cache(file);
  if (cached.erase(cache_key(config, device, dtype)) > 0) write_machine_cache(file, cached);
}

}  // namespace dtrain::train
