// What `dtrain plan` predicts a step's time with (Note [step time],
// src/plan/step_time.cpp): the links of --link and where the mesh's groups
// run (--ranks-per-host), and the compute rates of one rank's share of the
// machine (--gemm-gflops, --memory-gbps, or probed here).
#pragma once

#include "dtrain/plan.h"

#include <torch/types.h>

#include <string>

namespace dtrain {
struct TrainConfig;
}

namespace dtrain::cli {

struct PlanLinks {
  plan::Link intra;  // between ranks of one host
  plan::Link inter;  // across hosts
};
// --link: LATENCY_US,GB_PER_S (one link for all), intra=LATENCY_US,GB_PER_S,
// inter=LATENCY_US,GB_PER_S, or the JSON file `dtrain bench collectives
// --json` wrote (the median of its fitted ops' links, as intra and inter).
// Throws std::invalid_argument naming the forms.
PlanLinks parse_links(const std::string& text);

// A mesh (dp, pp, cp, tp), tp innermost, of nproc ranks placed
// ranks_per_host per host in rank order.
struct MeshPlacement {
  int pp = 1, cp = 1, tp = 1, nproc = 1;
  int ranks_per_host = 0;  // 0: one host
  // Whether the group of `rank` along the engine's dimensions (dp x cp), or
  // along the model's (tp, cp, pp), spans more than one host.
  bool engine_crosses_hosts(int rank) const;
  bool model_crosses_hosts(int rank) const;
};

// One rank's share of this machine: the GEMM rate in `dtype` (the cached
// probe of train::peak_flops, at `threads` threads) and the memory
// bandwidth, each times cores / (ranks_on_host x threads) where the ranks
// on a host have fewer cores than threads. Positive `gemm_gflops` or
// `memory_gbps` replace the probes. The communication share is 1 where the
// ranks' threads fill this machine's cores (no core left to drive the
// transfers), else 0, and 0 with `gemm_gflops` (another device's rates).
// Unless both are given, the probes' rates are calibrated by the model's
// efficiency: one forward and backward of config.model at `batch` samples
// (fp32, on `threads` threads) timed against what the probes' rates predict
// for it (Note [step time]); `efficiency` says what it was (1 where given
// or not measurable).
plan::ComputeRates compute_rates(const TrainConfig& config, torch::ScalarType dtype, int ranks_on_host,
                                 double gemm_gflops, double memory_gbps, int64_t batch, double& efficiency);

}  // namespace dtrain::cli
