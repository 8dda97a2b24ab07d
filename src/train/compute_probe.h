// How fast this machine runs a model's own mix of kernels: one forward,
// loss and backward timed, for the step time dtrain plan predicts (Note
// [step time], src/plan/step_time.cpp: the model's rates are the probes'
// times the efficiency this measures).
#pragma once

#include <cstdint>

namespace dtrain {
struct TrainConfig;
}

namespace dtrain::train {

// Seconds of one forward, loss and backward of config.model (fp32, on the
// CPU, with this process's threads) at `batch` samples of its training data,
// the best of two after a warm-up.
double time_forward_backward(const TrainConfig& config, int64_t batch);

}  // namespace dtrain::train
