// The built-in models' specs (src/train/builtin_models.h). Each says how to
// build the model, what it trains on, how to describe and count it, and
// which parallel hooks it has: the GPT family and llama have tensor-parallel
// and pipeline-stage builders.
#include "train/builtin_models.h"

#include "dtrain/deferred_init.h"
#include "dtrain/gpt_stage.h"
#include "dtrain/llama.h"
#include "dtrain/mesh.h"
#include "dtrain/models.h"
#include "dtrain/pipeline.h"
#include "dtrain/plan.h"
#include "dtrain/tp_gpt.h"
#include "dtrain/tp_gpt_stage.h"
#include "dtrain/tp_llama.h"
#include "dtrain/train.h"
#include "train/model.h"

#include <optional>
#include <sstream>
#include <stdexcept>

namespace dtrain::train {
namespace {

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument(message); }

void check_positive(const char* flag, int64_t value) {
  if (value < 1) fail(std::string(flag) + " must be at least 1, got " + std::to_string(value));
}

// The flags only llama reads are refused for the other transformers.
void refuse_llama_flags(const TrainConfig& c) {
  if (c.kv_heads != 0 || c.ffn_dim != 0 || c.rope_theta != 10000.0 || c.tie_embeddings)
    fail("--kv-heads, --ffn-dim, --rope-theta and --tie-embeddings describe --model llama, not --model " + c.model);
}

std::string layers(int64_t n) { return std::to_string(n) + (n == 1 ? " layer" : " layers"); }

// A model split across `tp_group` (TPGPT, TPGPTStage): the vocabulary-parallel
// loss per sample, the logits gathered for sampling, and which parameters are slices.
template <class Holder>
BuiltModel tensor_parallel_model(Holder module, const CommPtr& tp_group) {
  BuiltModel model = built_model(module);
  model.loss = [module](const torch::Tensor& logits, const torch::Tensor& targets) {
    return module->loss(logits, targets).view({targets.size(0), targets.size(1)}).mean(1);
  };
  model.full_logits = [tp_group](const torch::Tensor& logits) { return tp::gather_last_dim(logits, tp_group); };
  model.tp_group = tp_group;
  model.tp_split_names = tp::split_parameter_names(*module);
  return model;
}

// 6 FLOPs per multiply-add parameter (embedding tables read by index have
// none) plus attention's 12 L T C per token: one convention for every figure.
double transformer_flops(const TrainConfig& c, double matmul_parameters) {
  return 6 * matmul_parameters + 12.0 * static_cast<double>(c.gpt_layers * c.seq_len * c.gpt_dim);
}

// What a pipeline stage of a transformer says about itself besides its
// module: its group, the shapes it sends, and the tied weight the first and
// last stages both hold ("" = none).
void describe_stage(BuiltModel& model, const DeviceMesh& mesh, const std::string& tied_weight, int64_t width,
                    int64_t vocab_part) {
  model.pp_group = mesh.comm("pp");
  model.tied_weight = tied_weight;
  const auto [stage, stages] = pipeline_place(mesh);
  // The last stage's copy of a tied weight is counted on the first.
  if (!tied_weight.empty() && stages > 1 && stage == stages - 1) model.tied_copy = tied_weight;
  model.activation_shape = [width](int64_t samples, int64_t positions) {
    return std::vector<int64_t>{samples, positions, width};
  };
  model.output_shape = [vocab_part](int64_t samples, int64_t positions) {
    return std::vector<int64_t>{samples, positions, vocab_part};
  };
}

BuiltModel gpt_tensor_parallel(const TrainConfig& config, CommPtr tp_group) {
  BuiltModel model = tensor_parallel_model(models::TPGPT(gpt_config(config), tp_group, config.sequence_parallel), tp_group);
  model.parameters = models::GPTImpl::parameter_count(gpt_config(config));
  return model;
}

// The stage pipeline_place(mesh) names of the GPT, its blocks divided evenly among
// the stages; with "tp" on the mesh, split by tensor parallelism too.
BuiltModel gpt_stage(const TrainConfig& config, const DeviceMesh& mesh) {
  const auto [stage, stages] = pipeline_place(mesh);
  const models::GPTConfig gpt = gpt_config(config);
  const pp::StageBlocks blocks = pp::divide_blocks(gpt.n_layer, stages)[static_cast<size_t>(stage)];
  BuiltModel model;
  if (config.tp > 1) {
    const CommPtr tp_group = mesh.comm("tp");
    model = tensor_parallel_model(
        models::TPGPTStage(gpt, tp_group, stage, stages, blocks.first, blocks.last, config.sequence_parallel), tp_group);
  } else {
    model = built_model(models::GPTStage(gpt, stage, stages, blocks.first, blocks.last));
  }
  describe_stage(model, mesh, "wte.weight", config.gpt_dim, gpt.vocab_size / config.tp);
  {
    DeferredConstruction deferring;  // names, shapes and dtypes only
    model.whole = models::GPT(gpt).ptr();
  }
  model.parameters = models::GPTImpl::parameter_count(gpt);
  return model;
}

BuiltModel llama_tensor_parallel(const TrainConfig& config, CommPtr tp_group) {
  BuiltModel model =
      tensor_parallel_model(models::TPLlama(llama_config(config), tp_group, config.sequence_parallel), tp_group);
  model.parameters = models::LlamaImpl::parameter_count(llama_config(config));
  return model;
}

// The stage pipeline_place(mesh) names of Llama, its blocks divided evenly
// among the stages; with "tp" on the mesh, split by tensor parallelism too.
BuiltModel llama_stage(const TrainConfig& config, const DeviceMesh& mesh) {
  const auto [stage, stages] = pipeline_place(mesh);
  const models::LlamaConfig llama = llama_config(config);
  const pp::StageBlocks blocks = pp::divide_blocks(llama.n_layer, stages)[static_cast<size_t>(stage)];
  const models::LlamaPart part{stage, stages, blocks.first, blocks.last};
  BuiltModel model;
  if (config.tp > 1) {
    const CommPtr tp_group = mesh.comm("tp");
    model = tensor_parallel_model(models::TPLlama(llama, tp_group, config.sequence_parallel, part), tp_group);
  } else {
    model = built_model(models::Llama(llama, part));
  }
  describe_stage(model, mesh, llama.tie_embeddings ? "embed_tokens.weight" : "", llama.dim,
                 llama.vocab_size / config.tp);
  {
    DeferredConstruction deferring;  // names, shapes and dtypes only
    model.whole = models::Llama(llama).ptr();
  }
  model.parameters = models::LlamaImpl::parameter_count(llama);
  return model;
}

// --tp and --pp checks every transformer shares.
void check_transformer_mesh(const TrainConfig& c) {
  if (c.tp > 1 && c.gpt_heads % c.tp != 0)
    fail("--tp " + std::to_string(c.tp) + " does not divide --gpt-heads " + std::to_string(c.gpt_heads) +
         " (each rank computes whole heads)");
  const int64_t stages = static_cast<int64_t>(c.pp) * c.virtual_stages;
  if (c.pp > 1 && c.gpt_layers < stages)
    fail("--pp " + std::to_string(c.pp) +
         (c.virtual_stages > 1 ? " x --virtual-stages " + std::to_string(c.virtual_stages) : std::string()) +
         " needs at least " + std::to_string(stages) + " blocks (one per stage), got --gpt-layers " +
         std::to_string(c.gpt_layers));
}

ModelSpec gpt_family(const std::string& summary, bool gelu_tanh) {
  ModelSpec spec;
  spec.summary = summary;
  spec.build = [](const TrainConfig& c) { return built_model(models::GPT(gpt_config(c))); };
  spec.classification = false;
  spec.token_sequences = true;
  spec.checkpointable_blocks = true;
  spec.context_parallel = true;
  spec.float8_layers = true;  // the blocks' linear layers (models/project.h); the head and embeddings stay as they are
  spec.hugging_face = gpt2_hugging_face(gelu_tanh);
  spec.check = [](const TrainConfig& c) {
    check_transformer_flags(c, /*llama=*/false);
    check_transformer_mesh(c);
  };
  spec.describe = [](const TrainConfig& c) {
    std::ostringstream text;
    text << c.model << " (" << layers(c.gpt_layers) << ", dim " << c.gpt_dim << ", " << c.gpt_heads << " heads, context "
         << c.seq_len << (c.vocab_size != 256 ? ", vocab " + std::to_string(c.vocab_size) : std::string()) << ")";
    return text.str();
  };
  spec.flops_per_unit = [](const TrainConfig& c, int64_t parameters) {
    const int64_t positions = c.positions > 0 ? c.positions : c.seq_len;
    // wpe is read by index; wte is also the (tied) head, a matrix product.
    return transformer_flops(c, static_cast<double>(parameters - positions * c.gpt_dim));
  };
  spec.tensor_parallel = gpt_tensor_parallel;
  spec.pipeline_stage = gpt_stage;
  spec.plan_description = [](const TrainConfig& c, int64_t batch_per_rank, torch::ScalarType compute) {
    return plan::describe_tp_gpt(gpt_config(c), batch_per_rank, compute, c.tp, c.sequence_parallel, c.cp);
  };
  spec.plan_stage_description = [](const TrainConfig& c, int64_t batch_per_rank, int microbatches,
                                   torch::ScalarType compute, int stage) {
    return plan::describe_gpt_stage(gpt_config(c), batch_per_rank, microbatches, compute, stage,
                                    c.pp * c.virtual_stages, c.tp, c.sequence_parallel, c.cp);
  };
  return spec;
}

ModelSpec llama() {
  ModelSpec spec;
  spec.summary = "Llama: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention (--kv-heads, --ffn-dim)";
  spec.build = [](const TrainConfig& c) { return built_model(models::Llama(llama_config(c))); };
  spec.classification = false;
  spec.token_sequences = true;
  spec.checkpointable_blocks = true;
  spec.context_parallel = true;
  spec.float8_layers = true;  // the blocks' linear layers (models/project.h); the head and embeddings stay as they are
  spec.hugging_face = llama_hugging_face();
  spec.check = [](const TrainConfig& c) {
    check_transformer_flags(c, /*llama=*/true);
    check_transformer_mesh(c);
    const int64_t width = c.ffn_dim > 0 ? c.ffn_dim : models::default_ffn_dim(c.gpt_dim);
    if (c.tp > 1 && width % c.tp != 0)
      fail("--tp " + std::to_string(c.tp) + " does not divide the MLP's width of " + std::to_string(width) +
           " (--ffn-dim)");
  };
  spec.describe = [](const TrainConfig& c) {
    const int64_t kv = c.kv_heads > 0 ? c.kv_heads : c.gpt_heads;
    std::ostringstream text;
    text << "llama (" << layers(c.gpt_layers) << ", dim " << c.gpt_dim << ", " << c.gpt_heads << " heads"
         << (kv != c.gpt_heads ? " sharing " + std::to_string(kv) + " key/value heads" : "") << ", context " << c.seq_len
         << ", vocab " << c.vocab_size << ")";
    return text.str();
  };
  spec.flops_per_unit = [](const TrainConfig& c, int64_t parameters) {
    // embed_tokens is read by index unless it is also the (tied) head.
    const int64_t lookups = c.tie_embeddings ? 0 : c.vocab_size * c.gpt_dim;
    return transformer_flops(c, static_cast<double>(parameters - lookups));
  };
  spec.tensor_parallel = llama_tensor_parallel;
  spec.pipeline_stage = llama_stage;
  spec.plan_description = [](const TrainConfig& c, int64_t batch_per_rank, torch::ScalarType compute) {
    return plan::describe_llama(llama_config(c), batch_per_rank, compute, c.tp, c.sequence_parallel, c.cp);
  };
  spec.plan_stage_description = [](const TrainConfig& c, int64_t batch_per_rank, int microbatches,
                                   torch::ScalarType compute, int stage) {
    return plan::describe_llama_stage(llama_config(c), batch_per_rank, microbatches, compute, stage,
                                      c.pp * c.virtual_stages, c.tp, c.sequence_parallel, c.cp);
  };
  return spec;
}

ModelSpec mlp() {
  ModelSpec spec;
  spec.summary = "a multilayer perceptron on Fashion-MNIST (--mlp-hidden)";
  spec.build = [](const TrainConfig& c) { return built_model(models::MLP(c.mlp_hidden, c.dropout)); };
  spec.check = [](const TrainConfig& c) {
    if (c.mlp_hidden.empty()) fail("--mlp-hidden needs at least one width, e.g. 256,256");
    for (int64_t width : c.mlp_hidden) check_positive("--mlp-hidden widths", width);
    refuse_llama_flags(c);
  };
  spec.describe = [](const TrainConfig& c) {
    std::string text = "mlp (hidden";
    for (size_t i = 0; i < c.mlp_hidden.size(); ++i) text += (i == 0 ? " " : ",") + std::to_string(c.mlp_hidden[i]);
    return text + ")";
  };
  spec.flops_per_unit = [](const TrainConfig&, int64_t parameters) { return 6.0 * static_cast<double>(parameters); };
  spec.plan_description = [](const TrainConfig& c, int64_t batch_per_rank, torch::ScalarType compute) {
    return plan::describe_mlp(c.mlp_hidden, batch_per_rank, compute);
  };
  return spec;
}

ModelSpec cnn() {
  ModelSpec spec;
  spec.summary = "a small convolutional network on Fashion-MNIST";
  spec.build = [](const TrainConfig&) { return built_model(models::CNN()); };
  spec.check = refuse_llama_flags;
  spec.plan_description = [](const TrainConfig&, int64_t batch_per_rank, torch::ScalarType compute) {
    return plan::describe_cnn(batch_per_rank, compute);
  };
  return spec;  // no flops_per_unit: a convolution's FLOPs are not 6 per parameter, so no MFU
}

}  // namespace

void check_transformer_flags(const TrainConfig& c, bool llama) {
  check_positive("--gpt-layers", c.gpt_layers);
  check_positive("--gpt-dim", c.gpt_dim);
  check_positive("--gpt-heads", c.gpt_heads);
  check_positive("--seq-len", c.seq_len);
  if (c.gpt_dim % c.gpt_heads != 0)
    fail("--gpt-heads " + std::to_string(c.gpt_heads) + " must divide --gpt-dim " + std::to_string(c.gpt_dim));
  if (c.positions > 0 && c.seq_len > c.positions)
    fail("--seq-len " + std::to_string(c.seq_len) + " is longer than the model's context of " +
         std::to_string(c.positions) + " positions" +
         (c.model_config.empty() && c.model_config_json.empty() ? "" : " (its config.json)") +
         ": train on windows of at most " + std::to_string(c.positions));
  if (!(c.norm_eps >= 0.0)) fail("the normalisation's epsilon must be positive");
  if (!llama) return refuse_llama_flags(c);
  if (c.kv_heads < 0 || c.ffn_dim < 0) fail("--kv-heads and --ffn-dim must be >= 0 (0: the default)");
  const int64_t kv = c.kv_heads > 0 ? c.kv_heads : c.gpt_heads;
  if (c.gpt_heads % kv != 0)
    fail("--kv-heads " + std::to_string(kv) + " must divide --gpt-heads " + std::to_string(c.gpt_heads) +
         " (each key/value head serves gpt-heads / kv-heads query heads)");
  if ((c.gpt_dim / c.gpt_heads) % 2 != 0)
    fail("llama's head width --gpt-dim / --gpt-heads = " + std::to_string(c.gpt_dim / c.gpt_heads) +
         " must be even (rotary embeddings rotate pairs of features)");
  if (!(c.rope_theta > 0.0)) fail("--rope-theta must be positive, got " + std::to_string(c.rope_theta));
}

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

void register_builtin_models(const std::function<void(const std::string&, ModelSpec)>& add) {
  add("mlp", mlp());
  add("cnn", cnn());
  add("gpt", gpt_family("dtrain's byte-level GPT (--gpt-layers, --gpt-dim, --gpt-heads, --seq-len)", /*gelu_tanh=*/false));
  add("gpt2", gpt_family("GPT-2: the GPT with the tanh GELU; Hugging Face checkpoints in and out", /*gelu_tanh=*/true));
  add("llama", llama());
}

}  // namespace dtrain::train
