// Model FLOPs utilisation (MFU): the model's training FLOPs per second over
// what the hardware can do. The numerator counts the FLOPs the model needs
// (not what recomputation or padding adds); the denominator is the peak of
// a dense matrix product in the compute dtype, measured once per machine by
// a GEMM probe and cached, or given with --peak-tflops.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace dtrain {
struct TrainConfig;
}

namespace dtrain::train {

// Training FLOPs per sample or token (the metrics' unit) of config.model
// with `parameters` parameters, by one convention everywhere dtrain reports
// FLOPs (the progress line, the metrics, bench_gpt_cuda, bench/gpu_report.py's
// TFLOP/s column), PaLM's: 6 per parameter that takes part in a matrix
// product per token (forward 2, backward 4) plus attention's 12 * layers *
// seq_len * width (scores and weighted sum, forward and backward, counted
// without the causal mask's halving) for the transformers. Tables read by
// index do no multiply-adds and are left out: GPT's position embeddings,
// Llama's token embeddings unless they are also its head (GPT's token
// embeddings are its tied head, so they count). 6 per parameter per sample
// for the MLP; 0 (unknown) for the CNN, whose convolutions reuse each weight
// at every position. The model's spec says (ModelSpec::flops_per_unit; the
// built-ins' in src/train/builtin_models.cpp); 0 when it has no such hook.
double model_flops_per_unit(const TrainConfig& config, int64_t parameters);

struct PeakFlops {
  double flops = 0;    // per second, on one rank's share of the device
  std::string source;  // "--peak-tflops", "measured", "cached in PATH"
};

// The peak of this rank's device for `dtype` (bf16 with --mixed-precision
// bf16; fp32 otherwise, TF32 on GPUs with --tf32 on). From --peak-tflops,
// else the cache ($DTRAIN_CACHE_DIR, else $XDG_CACHE_HOME/dtrain, else
// ~/.cache/dtrain: peak_flops.json, keyed by device, dtype and threads),
// else a GEMM probe of about a second whose result is cached.
// A CPU probe is taken as the best of several rounds, and cached only when
// the process had its cores to itself throughout (its CPU time over wall
// time and threads): a probe run beside other work measures the load, not
// the machine (make test's runs once cached 30 of an idle core's 100
// GFLOP/s, and every later run printed an MFU of 198%).
PeakFlops peak_flops(const TrainConfig& config, const torch::Device& device, torch::ScalarType dtype);

// "796 TFLOP/s", "48.2 GFLOP/s": three significant digits at most.
std::string format_flops(double flops_per_s);

// Drops the cached peak for (device, dtype) so that the next run probes
// again: a run that went faster than that peak has shown it wrong.
void forget_cached_peak(const TrainConfig& config, const torch::Device& device, torch::ScalarType dtype);

}  // namespace dtrain::train
