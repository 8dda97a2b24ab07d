// The memory bandwidth a rank's elementwise kernels stream at, for the
// step time dtrain plan predicts (Note [step time], src/plan/step_time.cpp).
#pragma once

namespace dtrain::train {

// Bytes per second (read plus written) of a copy between two 64 MiB fp32
// tensors on the CPU with this process's threads, the best of five rounds
// (about a tenth of a second); cached per CPU and thread count
// (memory_bandwidth.json beside peak_flops.json, machine_cache.h), so that
// plans and --parallel auto choose alike from run to run.
double cpu_memory_bandwidth();

}  // namespace dtrain::train
