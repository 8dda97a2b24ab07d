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
// Each batch goes to `device` (--device) first.
Evaluation evaluate(const Forward& forward, Model& model, const data::Dataset& validation, int64_t count, int64_t chunk,
                    Communicator& world, const torch::Device& device = torch::kCPU);

// The same with each rank's part of a chunk evaluated by `part_loss`: the
// sum of its per-sample losses and (classification) its correct
// predictions. --pp: the stages of a pipeline evaluate their dp rank's part
// together, and each returns the pipeline's sums.
struct PartTotals {
  double loss_sum = 0, correct = 0;
};
using PartLoss = std::function<PartTotals(const data::Batch& part)>;
Evaluation evaluate(const PartLoss& part_loss, Model& model, const data::Dataset& validation, int64_t count,
                    int64_t chunk, Communicator& world, const torch::Device& device = torch::kCPU);

}  // namespace dtrain::train
