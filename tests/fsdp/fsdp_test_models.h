// Models for the FSDP tests: Sequential roots (children become units
// automatically) and a small GPT whose blocks are Sharded<> units. Parameter
// counts are deliberately not multiples of 2, 3 or 4.
#pragma once

#include <dtrain/models.h>
#include <dtrain/sync_batch_norm.h>

#include <torch/torch.h>

namespace fsdp_test {

constexpr int64_t kImage = 8;
constexpr int64_t kClasses = 4;

inline torch::nn::Sequential make_mlp() {
  return torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(kImage * kImage, 33), torch::nn::ReLU(),
                               torch::nn::Linear(33, 17), torch::nn::ReLU(), torch::nn::Linear(17, kClasses));
}

// Its SyncBatchNorm normalises over the global batch once given a
// communicator (set_sync_batch_norm_comm), so sharded training can equal
// single-process training.
inline torch::nn::Sequential make_cnn() {
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 5, 3).padding(1).bias(false)), dtrain::SyncBatchNorm(5),
      torch::nn::ReLU(), torch::nn::MaxPool2d(2), torch::nn::Flatten(),
      torch::nn::Linear(5 * (kImage / 2) * (kImage / 2), kClasses));
}

inline dtrain::models::GPTConfig tiny_gpt_config() {
  dtrain::models::GPTConfig config;
  config.seq_len = 12;
  config.n_layer = 4;
  config.n_embd = 24;
  config.n_head = 4;
  return config;
}

}  // namespace fsdp_test
