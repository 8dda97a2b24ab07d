#include "train/evaluate.h"

#include "train/device.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <vector>

namespace dtrain::train {

Evaluation evaluate(const Forward& forward, Model& model, const data::Dataset& validation, int64_t count, int64_t chunk,
                    Communicator& world, const torch::Device& device) {
  const auto part_loss = [&](const data::Batch& batch) {
    const torch::Tensor logits = forward(batch.inputs);
    PartTotals totals;
    totals.loss_sum = model.loss(logits, batch.targets).sum().item<double>();
    if (model.classification) totals.correct = logits.argmax(1).eq(batch.targets).sum().item<double>();
    return totals;
  };
  return evaluate(part_loss, model, validation, count, chunk, world, device);
}

Evaluation evaluate(const PartLoss& part_loss, Model& model, const data::Dataset& validation, int64_t count,
                    int64_t chunk, Communicator& world, const torch::Device& device) {
  const int world_size = world.size();
  if (count < world_size || count > validation.size())
    throw std::invalid_argument("evaluate: " + std::to_string(count) + " samples for " + std::to_string(world_size) +
                                " ranks from a split of " + std::to_string(validation.size()));
  // Equal chunks of at least 2 * world_size samples each hold at least
  // world_size samples, so every rank has a non-empty part of every chunk.
  chunk = std::max<int64_t>(chunk, 2 * world_size);
  const int64_t chunks = (count + chunk - 1) / chunk;

  const bool was_training = model.module->is_training();
  model.module->eval();
  torch::NoGradGuard no_grad;
  double loss_sum = 0;
  double correct = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const ShardRange in_chunk = shard_range(count, static_cast<int>(chunks), static_cast<int>(c));
    const ShardRange mine = shard_range(in_chunk.count, world_size, world.rank());
    std::vector<int64_t> indices(static_cast<size_t>(mine.count));
    std::iota(indices.begin(), indices.end(), in_chunk.offset + mine.offset);
    const PartTotals totals = part_loss(batch_on(validation.get_batch(indices), device));
    loss_sum += totals.loss_sum;
    correct += totals.correct;
  }
  model.module->train(was_training);

  auto totals = torch::tensor({loss_sum, correct}, torch::kFloat64);
  world.blocking().all_reduce(totals, ReduceOp::Sum);
  Evaluation result;
  result.samples = count;
  result.loss = totals[0].item<double>() / static_cast<double>(count);
  if (model.classification) result.accuracy = totals[1].item<double>() / static_cast<double>(count);
  return result;
}

}  // namespace dtrain::train
