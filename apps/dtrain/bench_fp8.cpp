#include "bench_fp8.h"

#include "json_file.h"

#include "dtrain/float8.h"
#include "train/cuda_runtime.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace dtrain::cli {
namespace {

struct Shape {
  int64_t k = 0, n = 0;
};

std::vector<Shape> parse_shapes(const std::string& text) {
  std::vector<Shape> shapes;
  std::stringstream list(text);
  std::string item;
  while (std::getline(list, item, ',')) {
    const auto x = item.find('x');
    try {
      if (x == std::string::npos) throw std::invalid_argument("no x");
      shapes.push_back({std::stoll(item.substr(0, x)), std::stoll(item.substr(x + 1))});
    } catch (const std::exception&) {
      throw std::invalid_argument("--shapes: '" + item + "' is not KxN (e.g. 4096x14336)");
    }
    if (shapes.back().k <= 0 || shapes.back().n <= 0) throw std::invalid_argument("--shapes: '" + item + "' must be positive");
  }
  if (shapes.empty()) throw std::invalid_argument("--shapes: no shape given");
  return shapes;
}

// Seconds per forward and backward of y = x W^T (bf16 x [M, K], W [N, K]):
// the median over `repeats`, after two untimed ones.
double time_layer(const torch::Device& device, int64_t m, const Shape& shape, Float8Scaling scaling, int repeats) {
  const auto options = torch::TensorOptions().device(device).dtype(torch::kBFloat16);
  const auto x = torch::randn({m, shape.k}, options).requires_grad_();
  const auto w = (torch::randn({shape.n, shape.k}, options) * 0.02).requires_grad_();
  const auto grad = torch::randn({m, shape.n}, options);
  const auto sync = [&] {
    if (device.is_cuda()) train::cuda::synchronize(device.index());
  };
  std::vector<double> seconds;
  for (int r = 0; r < repeats + 2; ++r) {
    x.mutable_grad() = torch::Tensor();
    w.mutable_grad() = torch::Tensor();
    sync();
    const auto start = std::chrono::steady_clock::now();
    float8_linear(x, w, {}, scaling).backward(grad);
    sync();
    if (r >= 2) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace

int bench_fp8_main(const BenchFp8Options& options) {
  const torch::Device device(options.device == "cuda" ? torch::kCUDA : torch::kCPU);
  if (device.is_cuda() && train::cuda::device_count() == 0)
    throw std::invalid_argument("dtrain bench fp8 --device cuda: no GPU here; --device cpu times the emulation");
  if (options.tokens < 16) throw std::invalid_argument("--tokens must be at least 16");
  if (options.repeats < 1) throw std::invalid_argument("--repeats must be at least 1");
  const auto shapes = parse_shapes(options.shapes);
  Float8Settings rule;
  rule.scaling = Float8Scaling::Tensorwise;
  rule.min_width = options.min_width;
  std::printf("dtrain bench fp8: y = x W^T, forward and backward, M = %lld tokens, on %s%s (median of %d)\n",
              static_cast<long long>(options.tokens), device.str().c_str(),
              device.is_cuda() ? " (at::_scaled_mm)" : " (the emulation: fp8 gives no speed on a CPU)", options.repeats);
  std::printf("%7s %7s %7s %-6s %10s %12s %12s\n", "K", "N", "KN/(K+N)", "taken", "bf16 ms", "tensorwise", "rowwise");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const auto& shape : shapes) {
    const double bf16 = time_layer(device, options.tokens, shape, Float8Scaling::Off, options.repeats);
    const bool eligible16 = shape.k % 16 == 0 && shape.n % 16 == 0;
    double tensorwise = 0, rowwise = 0;
    if (eligible16) {
      tensorwise = time_layer(device, options.tokens, shape, Float8Scaling::Tensorwise, options.repeats);
      rowwise = time_layer(device, options.tokens, shape, Float8Scaling::Rowwise, options.repeats);
    }
    const int64_t width = shape.k * shape.n / (shape.k + shape.n);
    const bool taken = float8_eligible(shape.k, shape.n, rule);
    if (eligible16)
      std::printf("%7lld %7lld %7lld %-6s %10.3f %11.3fx %11.3fx\n", static_cast<long long>(shape.k),
                  static_cast<long long>(shape.n), static_cast<long long>(width), taken ? "yes" : "no", bf16 * 1e3,
                  bf16 / tensorwise, bf16 / rowwise);
    else  // K or N not a multiple of 16: the kernel refuses it, the layer stays bf16
      std::printf("%7lld %7lld %7lld %-6s %10.3f %12s %12s\n", static_cast<long long>(shape.k),
                  static_cast<long long>(shape.n), static_cast<long long>(width), "no", bf16 * 1e3, "n/a", "n/a");
    rows.push_back({{"k", shape.k},
                    {"n", shape.n},
                    {"width", width},
                    {"taken", taken},
                    {"bf16_s", bf16},
                    {"tensorwise_s", eligible16 ? nlohmann::ordered_json(tensorwise) : nlohmann::ordered_json(nullptr)},
                    {"rowwise_s", eligible16 ? nlohmann::ordered_json(rowwise) : nlohmann::ordered_json(nullptr)}});
  }
  std::printf("speed-ups are bf16 time / fp8 time (> 1: fp8 is faster); 'taken': --fp8-min-width %lld takes the layer\n",
              static_cast<long long>(options.min_width));
  if (!options.json_path.empty() &&
      !write_json_file(options.json_path, {{"device", device.str()},
                                           {"tokens", options.tokens},
                                           {"min_width", options.min_width},
                                           {"shapes", rows}}))
    return 1;
  return 0;
}

CLI::App* add_bench_fp8_subcommand(CLI::App& bench, BenchFp8Options& options) {
  auto* cmd = bench.add_subcommand("fp8", "One linear layer in bf16 and fp8 (tensorwise, rowwise) over shapes: the "
                                          "measurement behind --fp8-min-width");
  cmd->add_option("--device", options.device, "cuda | cpu (the emulation; a dry run)")
      ->check(CLI::IsMember({"cuda", "cpu"}))->capture_default_str();
  cmd->add_option("--tokens", options.tokens, "M: rows of the input")->capture_default_str();
  cmd->add_option("--shapes", options.shapes, "KxN,...: in_features x out_features")->capture_default_str();
  cmd->add_option("--repeats", options.repeats, "Timed forward+backward per shape and format")->capture_default_str();
  cmd->add_option("--min-width", options.min_width, "The --fp8-min-width whose choice each row reports")
      ->capture_default_str();
  cmd->add_option("--json", options.json_path, "Also write the rows as JSON");
  return cmd;
}

}  // namespace dtrain::cli
