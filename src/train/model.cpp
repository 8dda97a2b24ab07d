#include "train/model.h"

#include "train/pipeline_chunks.h"

#include <dtrain/deferred_init.h>
#include <dtrain/models.h>
#include <dtrain/mesh.h>
#include <dtrain/strategy_table.h>

#include <optional>
#include <stdexcept>

namespace dtrain::train {
namespace {

// Note [no empty batches]
// Every forward the trainer runs (training, evaluation, sampling, the
// pipeline's microbatches, the parameter servers' workers) goes through
// Model::forward, which refuses a batch of zero samples. CPU kernels accept
// one and return empty tensors; CUDA's need not (on an H200, cuDNN attention
// returned an undefined tensor for a [0, T] batch and the next op failed), so
// such a call would pass every CPU test and fail only on a GPU. Callers that
// have nothing to run skip the call (sampling with --samples 0) or run a
// one-sample stand-in whose result they drop (Pipeline::evaluate's empty
// microbatches, which must still issue the engines' collectives).
void refuse_empty_batches(Model& model) {
  model.forward = [forward = std::move(model.forward)](const torch::Tensor& x) {
    if (x.dim() > 0 && x.size(0) == 0)
      throw std::logic_error("internal error: dtrain ran the model on an empty batch (shape " +
                             c10::str(x.sizes()) +
                             "); CPU kernels accept one, CUDA's may not. Note [no empty batches] in "
                             "src/train/model.cpp says which caller should have skipped it.");
    return forward(x);
  };
}

// What the spec built, completed from the spec: the loss, the logits, the
// parameter count, and what the run asks of the model.
Model complete(BuiltModel built, const ModelSpec& spec, const std::string& hook) {
  if (!built.module || !built.forward)
    throw std::invalid_argument("the model spec '" + spec.name + "': ModelSpec::" + hook +
                                " returned a model without its module or forward (dtrain::built_model(module) "
                                "fills both)");
  Model model;
  static_cast<BuiltModel&>(model) = std::move(built);
  refuse_empty_batches(model);
  if (!model.loss) model.loss = spec.loss ? spec.loss : cross_entropy_per_sample;
  if (!model.full_logits) model.full_logits = [](const torch::Tensor& logits) { return logits; };
  if (model.parameters == 0) model.parameters = models::parameter_count(*model.module);
  model.classification = spec.classification;
  model.token_sequences = spec.token_sequences;
  if (spec.hugging_face) model.hugging_face_layout = spec.hugging_face->layout;
  return model;
}

}  // namespace

const ModelSpec& model_spec(const TrainConfig& config) { return find_model(config.model); }

bool builds_deferred(const std::string& strategy) { return strategy_info(strategy).deferred_construction; }

Model build_model(const TrainConfig& config, bool deferred, CommPtr tp_group) {
  const ModelSpec& spec = model_spec(config);
  std::optional<DeferredConstruction> deferring;
  if (deferred) deferring.emplace();
  if (config.tp > 1) {
    if (!spec.tensor_parallel)
      throw std::invalid_argument("--tp needs ModelSpec::tensor_parallel, which --model " + spec.name + " lacks");
    if (!tp_group || tp_group->size() != config.tp)
      throw std::invalid_argument("build_model: --tp " + std::to_string(config.tp) + " needs its tensor-parallel group");
    return complete(spec.tensor_parallel(config, tp_group), spec, "tensor_parallel");
  }
  return complete(spec.build(config), spec, "build");
}

std::optional<DeviceMesh> make_mesh(const TrainConfig& config, const CommPtr& world) {
  if (config.tp == 1 && config.pp == 1 && config.cp == 1) return std::nullopt;
  std::vector<std::pair<std::string, int>> dimensions{{"dp", -1}};
  if (config.pp > 1) dimensions.emplace_back("pp", config.pp);
  if (config.cp > 1) dimensions.emplace_back("cp", config.cp);
  if (config.tp > 1) dimensions.emplace_back("tp", config.tp);
  std::optional<DeviceMesh> mesh(std::in_place, world, dimensions);
  // The cp ranks hold the same parameters and compute gradients of different
  // tokens: the data-parallel engine reduces (and shards) over dp x cp.
  if (config.cp > 1) mesh->flatten({"dp", "cp"}, "dp_cp");
  return mesh;
}

Model build_stage(const TrainConfig& config, const DeviceMesh& mesh, bool deferred) {
  const ModelSpec& spec = model_spec(config);
  if (!spec.pipeline_stage)
    throw std::invalid_argument("--pp needs ModelSpec::pipeline_stage, which --model " + spec.name + " lacks");
  std::optional<DeferredConstruction> deferring;
  if (deferred) deferring.emplace();
  std::function<void(int)> select_chunk;
  BuiltModel built;
  if (config.virtual_stages > 1) {
    PipelineChunks chunks = build_chunks(config, mesh, spec);
    built = std::move(chunks.model);
    select_chunk = std::move(chunks.select);
  } else {
    built = spec.pipeline_stage(config, mesh);
  }
  Model model = complete(std::move(built), spec, "pipeline_stage");
  model.select_chunk = std::move(select_chunk);
  if (!model.pp_group || !model.whole || !model.activation_shape || !model.output_shape)
    throw std::invalid_argument("the model spec '" + spec.name + "': ModelSpec::pipeline_stage must fill pp_group, "
                                "whole, activation_shape and output_shape (dtrain/model_spec.h)");
  model.mesh = &mesh;
  return model;
}

}  // namespace dtrain::train
