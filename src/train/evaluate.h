// Loss (and accuracy) on the validation split, computed by all ranks
// together: each evaluates its part of every chunk, and one all-reduce sums
// them.
#pragma once

#include "dtrain/comm.h"
#include "dtrain/data.h"
#include "train/model.h"

#include <cstdint>
#include <functional>
#include <optional>

namespace dtrain::train {

struct Evaluation {
  double loss = 0;                 // mean per-sample loss
  std::optional<double> accuracy;  // classification: fraction of correct predictions
  int64_t samples = 0;
};

// Evaluates the first `count` samples of `validation` (count >= the world
// size) in eval mode without gradients, in chunks of about `chunk` samples.
// Every rank runs the same number of forwards through `forward` (the
// strategy's, so engines that communicate in forward stay in step; a
// parameter-server worker's plain module). The model's training flag is
// restored afterwards.
using Forward = std::function<torch::Tensor(const torch::Tensor& inputs)>;
Evaluation evaluate(const Forward& forward, Model& model, const data::Dataset& validation, int64_t count, int64_t chunk,
                    Communicator& world);

}  // namespace dtrain::train
