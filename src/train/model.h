// The model a training run builds (--model mlp|cnn|gpt) and its loss.
#pragma once

#include "dtrain/hugging_face.h"
#include "dtrain/llama.h"
#include "dtrain/models.h"
#include "dtrain/train.h"

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/mesh.h"

namespace dtrain::train {

// A model as the trainer and the strategies see it, whatever its type: the
// module (for parameters, buffers, train/eval) and its forward.
struct Model {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  // Per-sample loss, float [B], of forward's output against the targets
  // (per_sample_loss below; under --tp the vocabulary-parallel one).
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss;
  // gpt: forward's logits -> logits over the whole vocabulary (under --tp
  // gathered from the group: only for sampling text); identity otherwise.
  std::function<torch::Tensor(const torch::Tensor&)> full_logits;
  // --tp: the group the model is split across, and the names of the
  // parameters that are slices (the others are replicated across it).
  CommPtr tp_group;
  std::vector<std::string> tp_split_names;
  // --tp, --pp: the trainer's mesh; checkpoints are the whole mesh's.
  const DeviceMesh* mesh = nullptr;
  // --pp: module is this rank's models::GPTStage (models::TPGPTStage with
  // --tp) and forward its forward (tokens or the previous stage's activation
  // -> activation or logits). `whole`: the whole GPT deferred (names and
  // shapes, no storage), which checkpoints list; `tied_copy`: the name of a
  // parameter this stage holds that another stage counts too (the last
  // stage's copy of the tied wte), left out of gradient norms.
  CommPtr pp_group;
  std::shared_ptr<torch::nn::Module> whole;
  std::string tied_copy;
  int64_t parameters = 0;      // of the whole model (all tensor-parallel slices)
  bool classification = true;  // mlp, cnn: logits [B,10]; gpt, gpt2, llama: [B,T,vocab] (under --tp: [B,T,vocab/tp])
};

// Builds config.model from LibTorch's default generator: seed it first
// (torch::manual_seed) so that every rank builds the same weights. With
// `deferred`, the parameters get no storage (dtrain/deferred_init.h): the
// sharded strategies materialise each unit straight into its shards. With
// config.tp > 1, the GPT is split across `tp_group` (dtrain/tp_gpt.h).
Model build_model(const TrainConfig& config, bool deferred = false, CommPtr tp_group = nullptr);

// --tp, --pp: the ranks as the (dp, pp, tp) mesh (tp innermost; the
// dimensions of size 1 left out); none without either.
std::optional<DeviceMesh> make_mesh(const TrainConfig& config, const CommPtr& world);

// --pp: this rank's stage of the GPT on `mesh` (dimensions "dp" and "pp"),
// its blocks divided evenly among the stages. Seed LibTorch's default
// generator first, as for build_model: the stages hold the weights of the
// GPT build_model gives after the same seed.
// With `deferred`, the stage's parameters get no storage (the sharded
// strategies materialise each unit into its shards).
Model build_stage(const TrainConfig& config, const DeviceMesh& mesh, bool deferred = false);

// Whether `strategy` (zero1, zero2, fsdp, hsdp) shards the model, and so
// builds it deferred.
bool builds_deferred(const std::string& strategy);

// The GPT that --gpt-layers, --gpt-dim, --gpt-heads, --seq-len, --dropout
// describe (gpt, gpt2; gpt2 with GPT-2's tanh GELU).
models::GPTConfig gpt_config(const TrainConfig& config);
// The Llama the same flags, --kv-heads, --ffn-dim, --rope-theta describe.
models::LlamaConfig llama_config(const TrainConfig& config);
// The model as config.json describes it (gpt, gpt2, llama), on the file the
// run was configured from when there is one: checkpoints keep it for
// `dtrain checkpoint export --format hf`.
hf::ModelConfig hf_model_config(const TrainConfig& config);

// gpt, gpt2: the GPT's modules (tensor and pipeline parallelism split them).
bool is_gpt_family(const std::string& model);

// Cross-entropy per sample, float [B]: of the logits against the class
// (classification), or the mean over a window's positions of each next
// byte's cross-entropy (gpt: logits [B,T,V], targets [B,T]).
torch::Tensor per_sample_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace dtrain::train
