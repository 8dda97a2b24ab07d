#include "plan_time.h"

#include "dtrain/train.h"
#include "dtrain/model_spec.h"
#include "train/compute_probe.h"
#include "train/memory_bandwidth.h"
#include "train/peak_flops.h"

#include <nlohmann/json.hpp>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sched.h>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::cli {
namespace {

constexpr const char* kForms =
    "LATENCY_US,GB_PER_S (e.g. 10,4), intra=LATENCY_US,GB_PER_S,inter=LATENCY_US,GB_PER_S, or the JSON file "
    "`dtrain bench collectives --nproc N --json FILE` wrote";

plan::Link parse_one(const std::string& text, const std::string& whole) {
  const std::string usage = "--link '" + whole + "' must be " + kForms;
  const auto comma = text.find(',');
  if (comma == std::string::npos) throw std::invalid_argument(usage);
  double latency_us = 0, gbps = 0;
  try {
    size_t used = 0;
    latency_us = std::stod(text.substr(0, comma), &used);
    if (used != comma) throw std::invalid_argument(usage);
    const std::string bandwidth = text.substr(comma + 1);
    gbps = std::stod(bandwidth, &used);
    if (used != bandwidth.size()) throw std::invalid_argument(usage);
  } catch (const std::logic_error&) {
    throw std::invalid_argument(usage);
  }
  if (!(latency_us >= 0) || !(gbps > 0) || !std::isfinite(latency_us) || !std::isfinite(gbps))
    throw std::invalid_argument(usage + "; the latency must be >= 0 and the bandwidth > 0");
  return {latency_us * 1e-6, gbps * 1e9};
}

plan::Link from_bench_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("--link '" + path + "' must be " + kForms + " (no file '" + path + "')");
  const auto json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("links") || !json["links"].is_array() || json["links"].empty())
    throw std::invalid_argument("--link " + path + ": not a `dtrain bench collectives --json` file with fitted links "
                                "(run it with --nproc 2 or more)");
  std::vector<double> latencies, bandwidths;
  for (const auto& link : json["links"]) {
    latencies.push_back(link.value("latency_seconds", 0.0));
    bandwidths.push_back(link.value("bytes_per_second", 0.0));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const plan::Link link{median(latencies), median(bandwidths)};
  if (!(link.bytes_per_second > 0)) throw std::invalid_argument("--link " + path + ": its fitted bandwidth is not positive");
  return link;
}

int allowed_cores() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  int cores = sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
  return cores > 0 ? cores : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

PlanLinks parse_links(const std::string& text) {
  if (text.rfind("intra=", 0) == 0) {
    const auto inter = text.find(",inter=");
    if (inter == std::string::npos)
      throw std::invalid_argument("--link '" + text + "' must be " + kForms);
    return {parse_one(text.substr(6, inter - 6), text), parse_one(text.substr(inter + 7), text)};
  }
  if (text.find(',') == std::string::npos) {
    const plan::Link link = from_bench_file(text);
    return {link, link};
  }
  const plan::Link link = parse_one(text, text);
  return {link, link};
}

namespace {

// The host of world rank r.
int host_of(int r, int ranks_per_host) { return ranks_per_host > 0 ? r / ranks_per_host : 0; }

}  // namespace

bool MeshPlacement::engine_crosses_hosts(int rank) const {
  // Ranks that differ from `rank` only in dp and cp.
  const int block = pp * cp * tp, p = rank / (cp * tp) % pp, t = rank % tp;
  const int host = host_of(rank, ranks_per_host);
  for (int d = 0; d < nproc / block; ++d)
    for (int c = 0; c < cp; ++c)
      if (host_of(d * block + p * cp * tp + c * tp + t, ranks_per_host) != host) return true;
  return false;
}

bool MeshPlacement::model_crosses_hosts(int rank) const {
  // The dp block of `rank` holds its tp, cp and pp groups.
  const int block = pp * cp * tp, first = rank / block * block;
  return host_of(first, ranks_per_host) != host_of(first + block - 1, ranks_per_host);
}

plan::ComputeRates compute_rates(const TrainConfig& config, torch::ScalarType dtype, int ranks_on_host,
                                 double gemm_gflops, double memory_gbps, int64_t batch, double& efficiency) {
  const int cores = allowed_cores();
  // The threads dtrain launch gives each rank (launch.cpp, default_threads_per_rank).
  const int threads = std::max(1, cores / std::max(1, ranks_on_host));
  const double share = std::min(1.0, static_cast<double>(cores) / (std::max(1, ranks_on_host) * threads));
  plan::ComputeRates rates;
  // This machine's cores drive the transfers when its ranks' threads fill
  // them; a rate given for another device (a GPU) has engines of its own.
  rates.communication_share = gemm_gflops <= 0 && ranks_on_host * threads >= cores ? 1.0 : 0.0;
  efficiency = 1;
  if (gemm_gflops > 0 && memory_gbps > 0) {  // both given: nothing of this machine to probe
    rates.flops_per_second = gemm_gflops * 1e9;
    rates.memory_bytes_per_second = memory_gbps * 1e9;
    return rates;
  }
  const int before = at::get_num_threads();
  at::set_num_threads(threads);
  const double probed_flops = train::peak_flops(config, torch::Device(torch::kCPU), dtype).flops;
  const double probed_bandwidth = train::cpu_memory_bandwidth();
  const ModelSpec& spec = find_model(config.model);
  if (spec.plan_description) {
    // The model's own kernels on one rank's threads, fp32, timed against the probes' rates.
    TrainConfig plain = config;
    plain.tp = plain.pp = plain.cp = 1;
    plain.sequence_parallel = false;
    const plan::ModelSpec whole = spec.plan_description(plain, batch, torch::kFloat32);
    const double fp32_flops =
        dtype == torch::kFloat32 ? probed_flops : train::peak_flops(config, torch::Device(torch::kCPU), torch::kFloat32).flops;
    const double predicted = plan::forward_backward_seconds(whole, {fp32_flops, probed_bandwidth});
    const double measured = train::time_forward_backward(plain, batch);
    if (predicted > 0 && measured > 0) efficiency = std::clamp(predicted / measured, 0.02, 4.0);
  }
  rates.flops_per_second = gemm_gflops > 0 ? gemm_gflops * 1e9 : probed_flops * efficiency * share;
  rates.memory_bytes_per_second = memory_gbps > 0 ? memory_gbps * 1e9 : probed_bandwidth * efficiency * share;
  at::set_num_threads(before);
  return rates;
}

}  // namespace dtrain::cli
