#include "train/memory_bandwidth.h"
#include "train/machine_cache.h"

#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <string>

namespace dtrain::train {
namespace {

double measure() {
  constexpr int64_t kElements = int64_t{16} << 20;  // 64 MiB of fp32: past every cache
  const torch::NoGradGuard no_grad;
  auto source = torch::ones({kElements});
  auto target = torch::empty({kElements});
  target.copy_(source);  // the pages are touched before the clock starts
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto start = std::chrono::steady_clock::now();
    target.copy_(source);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return 2.0 * kElements * 4 / best;
}

}  // namespace

double cpu_memory_bandwidth() {
  const auto file = machine_cache_file("memory_bandwidth.json");
  const std::string key = cpu_model() + " threads=" + std::to_string(at::get_num_threads());
  auto cached = read_machine_cache(file);
  if (cached.contains(key) && cached[key].is_number() && cached[key].get<double>() > 0)
    return cached[key].get<double>() * 1e9;
  const double bytes_per_second = measure();
  if (!file.empty()) {
    cached[key] = bytes_per_second / 1e9;  // GB/s
    write_machine_cache(file, cached);
  }
  return bytes_per_second;
}

}  // namespace dtrain::train
