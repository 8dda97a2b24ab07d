// The model a training run builds (--model mlp|cnn|gpt) and its loss.
#pragma once

#include "dtrain/model_spec.h"
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

// A model as the trainer and the strategies see it: what its spec built
// (dtrain/model_spec.h), with the loss and logits filled in and what the run
// needs from the spec.
struct Model : BuiltModel {
  bool classification = true;     // ModelSpec::classification
  bool token_sequences = false;   // ModelSpec::token_sequences
  // ModelSpec::hugging_face's layout, for --init-from DIR; unset without one.
  std::function<hf::Layout()> hugging_face_layout;
  // --schedule interleaved: selects which of the rank's chunks the next
  // forward runs (src/train/pipeline_chunks.h); unset otherwise.
  std::function<void(int chunk)> select_chunk;
};

// The spec --model names (dtrain/model_spec.h).
const ModelSpec& model_spec(const TrainConfig& config);

// Builds config.model through its spec from LibTorch's default generator:
// seed it first (torch::manual_seed) so that every rank builds the same
// weights. With `deferred`, the parameters get no storage
// (dtrain/deferred_init.h): the sharded strategies materialise each unit
// straight into its shards. With config.tp > 1, the spec's tensor_parallel
// hook splits it across `tp_group`.
Model build_model(const TrainConfig& config, bool deferred = false, CommPtr tp_group = nullptr);

// --tp, --pp, --cp: the ranks as the (dp, pp, cp, tp) mesh (tp innermost;
// the dimensions of size 1 left out; with cp, "dp_cp" flattened too); none
// without any.
std::optional<DeviceMesh> make_mesh(const TrainConfig& config, const CommPtr& world);

// --pp: this rank's stage on `mesh` (the spec's pipeline_stage hook). Seed
// LibTorch's default generator first, as for build_model: the stages hold
// the weights of the model build_model gives after the same seed.
// With `deferred`, the stage's parameters get no storage (the sharded
// strategies materialise each unit into its shards). With
// config.virtual_stages > 1, the rank's chunks merged into one model
// (src/train/pipeline_chunks.h), select_chunk set.
Model build_stage(const TrainConfig& config, const DeviceMesh& mesh, bool deferred = false);

// Whether `strategy` (zero1, zero2, fsdp, hsdp) shards the model, and so
// builds it deferred.
bool builds_deferred(const std::string& strategy);

}  // namespace dtrain::train
