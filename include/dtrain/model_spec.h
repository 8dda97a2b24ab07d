// Model specs and the model registry: how a training run builds, feeds and
// scores a model, so that any LibTorch module trains with every feature of
// `dtrain train` (strategies, checkpoints and resume on any layout, restarts,
// elastic resizes, signals, evaluation, metrics, traces).
//
//   dtrain::ModelSpec spec;
//   spec.build = [](const dtrain::TrainConfig&) { return dtrain::built_model(MyNet()); };
//   spec.data = [](const dtrain::TrainConfig& c) { return dtrain::ModelData{...}; };  // or --data
//   dtrain::register_model("mynet", spec);     // then --model mynet, or
//   dtrain::Trainer(config, spec).run(world);  // dtrain/trainer.h
//
// The five built-in models (mlp, cnn, gpt, gpt2, llama) are registered through
// this same API (src/train/builtin_models.cpp, their Hugging Face adapters in
// src/train/builtin_hugging_face.cpp). A run asks the spec, never the
// model's name: a feature that needs the model's cooperation (--tp, --pp,
// --activation-checkpointing) is refused when the spec lacks its hook, naming
// the hook.
#pragma once

#include <dtrain/comm.h>
#include <dtrain/data.h>

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtrain {

struct TrainConfig;
class DeviceMesh;
namespace plan {
// dtrain/plan.h. Declared only, so that this header stays light: a
// std::function naming it needs the complete type only where a callable is
// assigned (the built-ins' specs, src/train/builtin_models.cpp, include plan.h).
struct ModelSpec;
}
namespace hf {
class Config;   // dtrain/hugging_face.h, declared only (as plan::ModelSpec)
struct Layout;
}

// A model as a run sees it, whatever its module type: the module (for
// parameters, buffers, train/eval) and its forward, plus what the parallel
// hooks fill in.
struct BuiltModel {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  // Per-sample loss, float [B], of forward's output against the targets;
  // unset: the spec's loss (ModelSpec::loss, else cross-entropy).
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss;
  // Language models: forward's logits -> logits over the whole vocabulary
  // (under --tp gathered from the group, for sampling text); unset: identity.
  std::function<torch::Tensor(const torch::Tensor&)> full_logits;
  // ModelSpec::tensor_parallel: the group the model is split across, and the
  // names of the parameters that are slices (the others are replicated).
  CommPtr tp_group;
  std::vector<std::string> tp_split_names;
  // --tp, --pp: the run's mesh (the trainer sets it); checkpoints are the
  // whole mesh's.
  const DeviceMesh* mesh = nullptr;
  // ModelSpec::pipeline_stage: module is this rank's stage and forward its
  // forward (the inputs or the previous stage's activation -> an activation
  // or the output). `whole`: the whole model built deferred (names and
  // shapes, no storage), which checkpoints list. `tied_copy`: a parameter
  // this stage holds that another stage counts too, left out of gradient
  // norms; `tied_weight`: the name of a weight the first and last stages
  // both hold, whose gradients the pipeline sums ("" = none).
  CommPtr pp_group;
  std::shared_ptr<torch::nn::Module> whole;
  std::string tied_copy;
  std::string tied_weight;
  // ModelSpec::pipeline_stage: the shape of what a stage sends the next, and
  // of the last stage's output, for `samples` inputs of `positions` each
  // (training: --seq-len; sampling: the prompt's length so far).
  std::function<std::vector<int64_t>(int64_t samples, int64_t positions)> activation_shape;
  std::function<std::vector<int64_t>(int64_t samples, int64_t positions)> output_shape;
  // Of the whole model (all tensor-parallel slices and stages); 0: counted
  // from module.
  int64_t parameters = 0;
};

// A built model from a module holder (torch::nn::ModuleHolder, i.e. what
// TORCH_MODULE declares) whose forward takes one tensor.
template <class Holder>
BuiltModel built_model(Holder module) {
  BuiltModel model;
  model.module = module.ptr();
  model.forward = [module](const torch::Tensor& x) mutable { return module->forward(x); };
  return model;
}

// What Hugging Face model directories (dtrain/hugging_face.h) ask of a
// model: --init-from DIR and --model-config config.json build and load it,
// and `dtrain checkpoint export --format hf` writes one.
struct HuggingFaceAdapter {
  // config.json's "model_type" this model reads and writes ("llama").
  std::string model_type;
  // The transformers class that loads an export ("LlamaForCausalLM"), for
  // the export's hint.
  std::string architecture;
  // Whether a config.json of model_type describes this model, when several
  // specs read one model_type (GPT-2's tanh GELU or the exact one); unset:
  // every such file does.
  std::function<bool(const hf::Config&)> describes;
  // Sets the run's architecture flags from config.json (vocab_size,
  // positions, gpt_layers, ...), refusing with hf::Config::fail (naming the
  // field) what the model does not compute as transformers does.
  std::function<void(const hf::Config&, TrainConfig&)> read_config;
  // config.json's text for the run's architecture: `base` (the file the run
  // was configured from, or "") with the architecture's fields set.
  // Checkpoints keep it for the export.
  std::function<std::string(const TrainConfig&, const std::string& base)> write_config;
  // How the model's tensors are named and stored there.
  std::function<hf::Layout()> layout;
};

// The datasets a spec brings instead of --data.
struct ModelData {
  std::shared_ptr<data::Dataset> train;
  std::shared_ptr<data::Dataset> validation;
  int64_t units_per_sample = 1;  // what throughput counts per sample: 1 image, T tokens, ...
  std::string unit = "samples";  // "samples", "tokens", ...
  std::string description;       // the banner's data line
};

struct ModelSpec {
  // --model's name; register_model sets it.
  std::string name;
  // One line for `dtrain train --help` and the list of models.
  std::string summary;

  // ---- required
  // Builds the model from LibTorch's default generator (the run seeds it, so
  // every rank builds the same weights). Under a sharded strategy the run
  // calls it inside a dtrain::DeferredConstruction scope: build the module's
  // parameters with plain torch calls, and dtrain materialises them straight
  // into each rank's shards (dtrain/deferred_init.h).
  std::function<BuiltModel(const TrainConfig&)> build;

  // ---- batches, loss and evaluation
  // Per-sample loss, float [B]; unset: cross-entropy of output [B, classes]
  // against int64 targets [B], or of [B, T, V] against [B, T] (the mean over
  // positions).
  std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& targets)> loss;
  // Evaluation reports accuracy too: argmax of output [B, classes] against
  // targets [B].
  bool classification = true;
  // Trains on token windows of --seq-len (--data text:PATH or tokens:PATH):
  // throughput counts tokens and the run ends with generated samples. The
  // model's forward takes int64 [B, T] and returns logits [B, T, vocab].
  bool token_sequences = false;
  // Its own datasets; unset: --data (fashion-mnist for images, text:PATH or
  // tokens:PATH for token sequences).
  std::function<ModelData(const TrainConfig&)> data;

  // ---- optional hooks
  // Refuses what the model cannot be built with, throwing
  // std::invalid_argument that names the flag.
  std::function<void(const TrainConfig&)> check;
  // The banner's model description; unset: the name.
  std::function<std::string(const TrainConfig&)> describe;
  // Model FLOPs per sample unit (ModelData::unit: a token, an image) of a
  // training step, for MFU (6 per multiply-add parameter for a dense model);
  // unset: no MFU.
  std::function<double(const TrainConfig&, int64_t parameters)> flops_per_unit;
  // --tp N: the model split across `tp_group` (fills tp_group,
  // tp_split_names, and loss and full_logits when they differ).
  std::function<BuiltModel(const TrainConfig&, CommPtr tp_group)> tensor_parallel;
  // --pp N: this rank's stage on `mesh` (dimensions "pp", and "tp" with
  // --tp), as BuiltModel's pipeline fields say: stage pipeline_place(mesh)
  // (below). With --schedule interleaved it is called once per chunk.
  std::function<BuiltModel(const TrainConfig&, const DeviceMesh& mesh)> pipeline_stage;
  // The model declares its blocks as FSDP units (dtrain::Sharded<>):
  // --activation-checkpointing recomputes them in their backward.
  bool checkpointable_blocks = false;
  // --cp N: the model runs on sequence shards, taking its tokens' positions
  // from models::sequence_positions and its attention from
  // models::causal_attention (Note [sequence context], dtrain/attention.h),
  // and its loss is a mean over positions ([B, T, V] logits of [B, T] tokens).
  bool context_parallel = false;
  // --fp8: the model's forward calls dtrain::linear for its linear layers
  // (dtrain/float8.h), which multiplies in fp8 under the run's settings.
  bool float8_layers = false;
  // The closing samples of a token_sequences run (--samples): continues
  // `prompts` (int64 [count, P]) by `new_tokens` tokens and returns int64
  // [count, P + new_tokens]. `logits` runs the model through the run's
  // strategy (int64 [n, t], t <= --seq-len -> float [n, t, vocab], the whole
  // vocabulary) and is collective: call it the same times with the same
  // shapes whatever the rank, drawing randomness from `generator` only
  // (seeded alike on every rank). Unset: autoregressive sampling at
  // temperature 0.8 over windows of --seq-len (dtrain::models::sample_continuations).
  std::function<torch::Tensor(const torch::Tensor& prompts, int64_t new_tokens, const TrainConfig& config,
                              at::Generator generator, const std::function<torch::Tensor(const torch::Tensor&)>& logits)>
      sample;
  // Hugging Face model directories in and out (--init-from DIR,
  // --model-config, `dtrain checkpoint export --format hf`); unset: refused,
  // naming this hook.
  std::optional<HuggingFaceAdapter> hugging_face;
  // `dtrain plan`'s description of the model at `batch_per_rank` samples per
  // rank computing in `compute` (dtrain/plan.h: units, parameters,
  // activations by formula); under --tp, its slice. Unset: the plan counts
  // the parameters exactly from the model built deferred, and measures the
  // activations with one probe step at two small batches, scaled
  // (src/train/plan_model.cpp; the plan says which).
  std::function<plan::ModelSpec(const TrainConfig&, int64_t batch_per_rank, torch::ScalarType compute)>
      plan_description;
  // `dtrain plan --pp`: stage `stage` of the model's config.pp x
  // config.virtual_stages stages as pipeline_stage builds it, at
  // `microbatches` microbatches of the rank's batch part. Under --schedule
  // interleaved the plan calls it for each of a rank's chunks and merges
  // them (plan::interleave_stages).
  std::function<plan::ModelSpec(const TrainConfig&, int64_t batch_per_rank, int microbatches, torch::ScalarType compute,
                                int stage)>
      plan_stage_description;
};

// Which of how many consecutive stages ModelSpec::pipeline_stage builds:
// the mesh's pp rank and size, but under --schedule interleaved with V
// virtual stages, where the hook is called V times on each rank, for the
// model's stages rank, rank + pp, ..., rank + (V-1) pp of pp x V. The
// trainer merges the chunks into the rank's model by name (a name held by
// two chunks is refused), so each must carry the whole model's names, as
// a stage does; the first stage takes the inputs, the last gives the output.
struct PipelinePlace {
  int stage = 0;
  int stages = 1;
};
PipelinePlace pipeline_place(const DeviceMesh& mesh);

// Adds `spec` under `name` (letters, digits, '-', '_', '.'), or replaces the
// spec a program registered under it (a run already holding the old one keeps
// it). Throws std::invalid_argument for a bad name, a built-in's name, or a
// spec without build. Safe to call from several threads.
void register_model(const std::string& name, ModelSpec spec);
// The spec registered under `name`; throws std::invalid_argument naming the
// registered ones otherwise.
const ModelSpec& find_model(const std::string& name);
bool has_model(const std::string& name);
// The registered names in the order they were registered: the built-ins first.
std::vector<std::string> model_names();

// The registered model a Hugging Face config.json describes: the first
// whose ModelSpec::hugging_face reads its model_type and describes it (or,
// when none describes it, the first that reads its model_type, whose
// read_config then names what it cannot build). Throws
// std::invalid_argument naming the file and the model types registered.
std::string model_for_hugging_face(const hf::Config& config);

// Cross-entropy per sample, the default ModelSpec::loss.
torch::Tensor cross_entropy_per_sample(const torch::Tensor& output, const torch::Tensor& targets);

}  // namespace dtrain
