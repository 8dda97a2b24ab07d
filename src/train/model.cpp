#include "train/model.h"

#include <dtrain/deferred_init.h>
#include <dtrain/gpt_stage.h>
#include <dtrain/mesh.h>
#include <dtrain/pipeline.h>
#include <dtrain/strategy_table.h>
#include <dtrain/tp_gpt.h>
#include <dtrain/tp_gpt_stage.h>

#include <torch/nn/functional/loss.h>

#include <optional>
#include <stdexcept>

namespace dtrain::train {

namespace {

// The module and its forward, for a model of any holder type.
//
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
template <class Holder>
void set_module(Model& model, Holder module) {
  model.module = module.ptr();
  model.forward = [module](const torch::Tensor& x) mutable {
    if (x.dim() > 0 && x.size(0) == 0)
      throw std::logic_error("internal error: dtrain ran the model on an empty batch (shape " +
                             c10::str(x.sizes()) +
                             "); CPU kernels accept one, CUDA's may not. Note [no empty batches] in "
                             "src/train/model.cpp says which caller should have skipped it.");
    return module->forward(x);
  };
}

// A model split across `tp_group` (TPGPT, TPGPTStage): the vocabulary-parallel
// loss per sample, the logits gathered for sampling, and which parameters are slices.
template <class Holder>
void set_tensor_parallel(Model& model, Holder module, const CommPtr& tp_group) {
  set_module(model, module);
  model.loss = [module](const torch::Tensor& logits, const torch::Tensor& targets) {
    return module->loss(logits, targets).view({targets.size(0), targets.size(1)}).mean(1);
  };
  model.full_logits = [tp_group](const torch::Tensor& logits) { return tp::gather_last_dim(logits, tp_group); };
  model.tp_group = tp_group;
  model.tp_split_names = tp::split_parameter_names(*module);
}

}  // namespace

bool builds_deferred(const std::string& strategy) { return strategy_info(strategy).deferred_construction; }

Model build_model(const TrainConfig& config, bool deferred, CommPtr tp_group) {
  std::optional<DeferredConstruction> deferring;
  if (deferred) deferring.emplace();
  Model model;
  if (config.model == "mlp") {
    set_module(model, models::MLP(config.mlp_hidden, config.dropout));
  } else if (config.model == "cnn") {
    set_module(model, models::CNN());
  } else if (is_gpt_family(config.model) && config.tp > 1) {
    if (!tp_group || tp_group->size() != config.tp)
      throw std::invalid_argument("build_model: --tp " + std::to_string(config.tp) + " needs its tensor-parallel group");
    set_tensor_parallel(model, models::TPGPT(gpt_config(config), tp_group, config.sequence_parallel), tp_group);
    model.classification = false;
    model.parameters = models::GPTImpl::parameter_count(gpt_config(config));
    return model;
  } else if (is_gpt_family(config.model)) {
    set_module(model, models::GPT(gpt_config(config)));
    model.classification = false;
  } else if (config.model == "llama") {
    set_module(model, models::Llama(llama_config(config)));
    model.classification = false;
  } else {
    throw std::invalid_argument("--model '" + config.model + "' is not one of mlp, cnn, gpt, gpt2, llama");
  }
  model.loss = per_sample_loss;
  model.full_logits = [](const torch::Tensor& logits) { return logits; };
  model.parameters = models::parameter_count(*model.module);
  return model;
}

std::optional<DeviceMesh> make_mesh(const TrainConfig& config, const CommPtr& world) {
  if (config.tp == 1 && config.pp == 1) return std::nullopt;
  std::vector<std::pair<std::string, int>> dimensions{{"dp", -1}};
  if (config.pp > 1) dimensions.emplace_back("pp", config.pp);
  if (config.tp > 1) dimensions.emplace_back("tp", config.tp);
  return std::optional<DeviceMesh>(std::in_place, world, dimensions);
}

Model build_stage(const TrainConfig& config, const DeviceMesh& mesh, bool deferred) {
  const int stage = mesh.rank("pp"), stages = mesh.size("pp");
  const models::GPTConfig gpt = gpt_config(config);
  const pp::StageBlocks blocks = pp::divide_blocks(gpt.n_layer, stages)[static_cast<size_t>(stage)];
  std::optional<DeferredConstruction> deferring;
  if (deferred) deferring.emplace();
  Model model;
  if (config.tp > 1) {
    // Tensor parallelism inside the stage: a (dp, pp, tp) mesh.
    const CommPtr tp_group = mesh.comm("tp");
    models::TPGPTStage module(gpt, tp_group, stage, stages, blocks.first, blocks.last);
    set_tensor_parallel(model, module, tp_group);
  } else {
    models::GPTStage module(gpt, stage, stages, blocks.first, blocks.last);
    set_module(model, module);
    model.loss = per_sample_loss;
    model.full_logits = [](const torch::Tensor& logits) { return logits; };
  }
  // The last stage's copy of the tied wte is counted on the first.
  if (stages > 1 && stage == stages - 1) model.tied_copy = "wte.weight";
  model.mesh = &mesh;
  model.pp_group = mesh.comm("pp");
  {
    DeferredConstruction deferring;  // names, shapes and dtypes only
    model.whole = models::GPT(gpt).ptr();
  }
  model.parameters = models::GPTImpl::parameter_count(gpt);
  model.classification = false;
  return model;
}

bool is_gpt_family(const std::string& model) { return model == "gpt" || model == "gpt2"; }

models::GPTConfig gpt_config(const TrainConfig& config) {
  models::GPTConfig gpt;
  gpt.seq_len = config.positions > 0 ? config.positions : config.seq_len;
  gpt.gelu_tanh = config.model == "gpt2";
  if (config.norm_eps > 0) gpt.layer_norm_eps = config.norm_eps;
  gpt.n_layer = config.gpt_layers;
  gpt.n_embd = config.gpt_dim;
  gpt.n_head = config.gpt_heads;
  gpt.dropout = config.dropout;
  gpt.vocab_size = config.vocab_size;
  return gpt;
}

models::LlamaConfig llama_config(const TrainConfig& config) {
  models::LlamaConfig llama;
  llama.vocab_size = config.vocab_size;
  llama.seq_len = config.positions > 0 ? config.positions : config.seq_len;
  llama.n_layer = config.gpt_layers;
  llama.dim = config.gpt_dim;
  llama.n_head = config.gpt_heads;
  llama.n_kv_head = config.kv_heads > 0 ? config.kv_heads : config.gpt_heads;
  llama.ffn_dim = config.ffn_dim;
  llama.rope_theta = config.rope_theta;
  if (config.norm_eps > 0) llama.rms_norm_eps = config.norm_eps;
  llama.tie_embeddings = config.tie_embeddings;
  llama.dropout = config.dropout;
  return llama;
}

hf::ModelConfig hf_model_config(const TrainConfig& config) {
  hf::ModelConfig model;
  model.model = config.model;
  model.gpt = gpt_config(config);
  model.llama = llama_config(config);
  model.json = config.model_config_json;
  return model;
}

torch::Tensor per_sample_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  namespace F = torch::nn::functional;
  const auto none = F::CrossEntropyFuncOptions().reduction(torch::kNone);
  if (logits.dim() == 2) return F::cross_entropy(logits, targets, none);
  const int64_t batch = logits.size(0), positions = logits.size(1);
  auto per_position = F::cross_entropy(logits.reshape({batch * positions, logits.size(2)}), targets.reshape(-1), none);
  return per_position.view({batch, positions}).mean(1);
}

}  // namespace dtrain::train
