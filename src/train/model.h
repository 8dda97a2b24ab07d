// The model a training run builds (--model mlp|cnn|gpt) and its loss.
#pragma once

#include "dtrain/models.h"
#include "dtrain/train.h"

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>

namespace dtrain::train {

// A model as the trainer and the strategies see it, whatever its type: the
// module (for parameters, buffers, train/eval) and its forward.
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  models::GPT gpt{nullptr};  // set for gpt, for generation
  int64_t parameters = 0;
  bool classification = true;  // mlp, cnn: logits [B,10]; gpt: logits [B,T,256]
};

// Builds config.model from LibTorch's default generator: seed it first
// (torch::manual_seed) so that every rank builds the same weights. With
// `deferred`, the parameters get no storage (dtrain/deferred_init.h): the
// sharded strategies materialise each unit straight into its shards.
Model build_model(const TrainConfig& config, bool deferred = false);

// Whether `strategy` (zero1, zero2, fsdp, hsdp) shards the model, and so
// builds it deferred.
bool builds_deferred(const std::string& strategy);

// The GPT that --gpt-layers, --gpt-dim, --gpt-heads, --seq-len, --dropout describe.
models::GPTConfig gpt_config(const TrainConfig& config);

// Cross-entropy per sample, float [B]: of the logits against the class
// (classification), or the mean over a window's positions of each next
// byte's cross-entropy (gpt: logits [B,T,V], targets [B,T]).
torch::Tensor per_sample_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace dtrain::train
