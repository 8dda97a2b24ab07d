// The built-in transformers' Hugging Face adapters (ModelSpec::hugging_face,
// src/train/builtin_models.h): GPT-2 (gpt2 with its tanh GELU, gpt with the
// exact GELU) and Llama, as transformers' GPT2LMHeadModel and
// LlamaForCausalLM name, lay out and configure them.
//
//   GPT-2  transformer.wte.weight           <-> wte.weight
//          transformer.h.N.attn.c_attn.*    <-> blocks.N.qkv.*       (the weight transposed)
//          transformer.h.N.attn.c_proj.*    <-> blocks.N.attn_proj.* (the weight transposed)
//          transformer.h.N.mlp.c_fc.*       <-> blocks.N.mlp_fc.*    (the weight transposed)
//          transformer.h.N.mlp.c_proj.*     <-> blocks.N.mlp_proj.*  (the weight transposed)
//          transformer.{wpe,h.N.ln_1,h.N.ln_2,ln_f}.* <-> the same without "transformer." and with
//          "blocks" for "h"
//   Llama  model.X <-> X; lm_head.weight <-> lm_head.weight
// Skipped when a file has them: GPT-2's tied lm_head.weight and
// attention-mask buffers (attn.bias, attn.masked_bias), Llama's
// rotary_emb.inv_freq and, for a tied Llama, lm_head.weight.
#include "dtrain/hugging_face.h"
#include "dtrain/train.h"
#include "train/builtin_models.h"

#include <nlohmann/json.hpp>

#include <map>
#include <regex>
#include <stdexcept>

namespace dtrain::train {
namespace {

using nlohmann::json;

// GPT-2's Conv1D layers ([in, out] weights) and their dtrain names.
const std::map<std::string, std::string>& gpt2_block_names() {
  static const std::map<std::string, std::string> names{{"ln_1", "ln_1"},           {"attn.c_attn", "qkv"},
                                                         {"attn.c_proj", "attn_proj"}, {"ln_2", "ln_2"},
                                                         {"mlp.c_fc", "mlp_fc"},       {"mlp.c_proj", "mlp_proj"}};
  return names;
}

std::string gpt2_name(const std::string& name, bool* transposed) {
  if (transposed) *transposed = false;
  static const std::regex block(R"(blocks\.(\d+)\.(\w+)\.(weight|bias))");
  std::smatch match;
  if (std::regex_match(name, match, block)) {
    for (const auto& [hf, ours] : gpt2_block_names()) {
      if (ours != match[2].str()) continue;
      if (transposed) *transposed = match[3] == "weight" && hf.rfind("ln_", 0) != 0;
      return "transformer.h." + match[1].str() + "." + hf + "." + match[3].str();
    }
  }
  for (const char* top : {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"})
    if (name == top) return "transformer." + name;
  throw std::invalid_argument("'" + name + "' has no Hugging Face GPT-2 name");
}

hf::Layout gpt2_layout() {
  hf::Layout layout;
  layout.name = gpt2_name;
  layout.skipped = [](const std::string& name) {
    static const std::regex buffers(R"((transformer\.)?h\.\d+\.attn\.(bias|masked_bias))");
    return name == "lm_head.weight" || std::regex_match(name, buffers);
  };
  layout.optional_prefix = "transformer.";
  return layout;
}

hf::Layout llama_layout() {
  hf::Layout layout;
  layout.name = [](const std::string& name, bool* transposed) {
    if (transposed) *transposed = false;
    return name == "lm_head.weight" ? name : "model." + name;
  };
  layout.skipped = [](const std::string& name) {
    static const std::regex rotary(R"(model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");
    return name == "lm_head.weight" || std::regex_match(name, rotary);
  };
  return layout;
}

// GPT-2's activation_function: the tanh approximation (gelu_new,
// gelu_pytorch_tanh) or the exact GELU (gelu).
bool reads_tanh_gelu(const hf::Config& file) {
  const std::string activation = file.string("activation_function", "gelu_new");
  if (activation == "gelu_new" || activation == "gelu_pytorch_tanh") return true;
  if (activation == "gelu") return false;
  file.fail("\"activation_function\": \"" + activation + "\" is not supported (gelu_new, gelu_pytorch_tanh or gelu)");
}

void read_gpt2(const hf::Config& file, TrainConfig& c) {
  reads_tanh_gelu(file);  // refuses an activation neither GELU computes
  c.vocab_size = file.integer("vocab_size");
  c.positions = file.integer("n_positions", file.integer("n_ctx", 1024));
  c.gpt_dim = file.integer("n_embd");
  c.gpt_layers = file.integer("n_layer");
  c.gpt_heads = file.integer("n_head");
  if (c.gpt_dim % c.gpt_heads != 0)
    file.fail("n_head " + std::to_string(c.gpt_heads) + " does not divide n_embd " + std::to_string(c.gpt_dim));
  if (file.has("n_inner") && file.integer("n_inner") != 4 * c.gpt_dim)
    file.fail("\"n_inner\": " + std::to_string(file.integer("n_inner")) + " is not supported (dtrain's GPT-2 MLP is " +
              "4 x n_embd = " + std::to_string(4 * c.gpt_dim) + " wide)");
  c.norm_eps = file.number("layer_norm_epsilon", 1e-5);
  file.require("scale_attn_weights", true, "attention scores are scaled by 1/sqrt(head_dim)");
  file.require("scale_attn_by_inverse_layer_idx", false, "no per-layer scaling");
  file.require("add_cross_attention", false, "a decoder-only model");
  file.require("tie_word_embeddings", true, "GPT-2's head is its token embedding");
}

void read_llama(const hf::Config& file, TrainConfig& c) {
  c.vocab_size = file.integer("vocab_size");
  c.positions = file.integer("max_position_embeddings", 2048);
  c.gpt_dim = file.integer("hidden_size");
  c.gpt_layers = file.integer("num_hidden_layers");
  c.gpt_heads = file.integer("num_attention_heads");
  c.kv_heads = file.integer("num_key_value_heads", c.gpt_heads);
  c.ffn_dim = file.integer("intermediate_size");
  c.norm_eps = file.number("rms_norm_eps", 1e-6);
  c.tie_embeddings = file.boolean("tie_word_embeddings", false);
  // rope_theta: a top-level field, or (newer files) inside rope_parameters.
  c.rope_theta = file.number("rope_theta", 10000.0);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!file.has(key)) continue;
    const hf::Config rope = file.object(key);
    const std::string type = rope.string("rope_type", rope.string("type", "default"));
    if (type != "default")
      file.fail(std::string("\"") + key + "\": rope_type \"" + type + "\" is not supported (only the default rotary embedding)");
    c.rope_theta = rope.number("rope_theta", c.rope_theta);
  }
  if (c.gpt_dim % c.gpt_heads != 0)
    file.fail("num_attention_heads " + std::to_string(c.gpt_heads) + " does not divide hidden_size " +
              std::to_string(c.gpt_dim));
  if (file.has("head_dim") && file.integer("head_dim") != c.gpt_dim / c.gpt_heads)
    file.fail("\"head_dim\": " + std::to_string(file.integer("head_dim")) + " is not supported (dtrain's heads are " +
              "hidden_size / num_attention_heads = " + std::to_string(c.gpt_dim / c.gpt_heads) + " wide)");
  file.require("hidden_act", "silu", "the SwiGLU MLP gates with SiLU");
  file.require("attention_bias", false, "Llama's projections have no biases");
  file.require("mlp_bias", false, "Llama's projections have no biases");
}

json base_fields(const std::string& base) {
  json fields = base.empty() ? json::object() : json::parse(base, nullptr, false);
  return fields.is_object() ? fields : json::object();
}

// The fields every export sets: the weights are fp32, whatever the run computed in.
std::string with_export_fields(json fields) {
  if (!fields.contains("initializer_range")) fields["initializer_range"] = 0.02;
  fields["torch_dtype"] = "float32";
  fields.erase("dtype");
  return fields.dump(2) + "\n";
}

std::string write_gpt2(const TrainConfig& c, const std::string& base) {
  const models::GPTConfig g = gpt_config(c);
  json fields = base_fields(base);
  fields["architectures"] = json::array({"GPT2LMHeadModel"});
  fields["model_type"] = "gpt2";
  fields["vocab_size"] = g.vocab_size;
  fields["n_positions"] = g.seq_len;
  fields["n_embd"] = g.n_embd;
  fields["n_layer"] = g.n_layer;
  fields["n_head"] = g.n_head;
  fields["n_inner"] = nullptr;
  fields["activation_function"] = g.gelu_tanh ? "gelu_new" : "gelu";
  fields["layer_norm_epsilon"] = g.layer_norm_eps;
  for (const char* dropout : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) fields[dropout] = g.dropout;
  fields["scale_attn_weights"] = true;
  fields["tie_word_embeddings"] = true;
  return with_export_fields(std::move(fields));
}

std::string write_llama(const TrainConfig& c, const std::string& base) {
  const models::LlamaConfig l = llama_config(c);
  json fields = base_fields(base);
  fields["architectures"] = json::array({"LlamaForCausalLM"});
  fields["model_type"] = "llama";
  fields["vocab_size"] = l.vocab_size;
  fields["max_position_embeddings"] = l.seq_len;
  fields["hidden_size"] = l.dim;
  fields["num_hidden_layers"] = l.n_layer;
  fields["num_attention_heads"] = l.n_head;
  fields["num_key_value_heads"] = l.n_kv_head;
  fields["head_dim"] = l.dim / l.n_head;
  fields["intermediate_size"] = l.ffn_dim > 0 ? l.ffn_dim : models::default_ffn_dim(l.dim);
  fields["rms_norm_eps"] = l.rms_norm_eps;
  fields["rope_theta"] = l.rope_theta;
  fields["tie_word_embeddings"] = l.tie_embeddings;
  fields["attention_dropout"] = l.dropout;
  fields["hidden_act"] = "silu";
  fields["attention_bias"] = false;
  fields["mlp_bias"] = false;
  fields["rope_scaling"] = nullptr;
  fields.erase("rope_parameters");
  return with_export_fields(std::move(fields));
}

}  // namespace

HuggingFaceAdapter gpt2_hugging_face(bool tanh) {
  HuggingFaceAdapter adapter;
  adapter.model_type = "gpt2";
  adapter.architecture = "GPT2LMHeadModel";
  adapter.describes = [tanh](const hf::Config& file) {
    const std::string activation = file.string("activation_function", "gelu_new");
    return tanh ? activation == "gelu_new" || activation == "gelu_pytorch_tanh" : activation == "gelu";
  };
  adapter.read_config = read_gpt2;
  adapter.write_config = write_gpt2;
  adapter.layout = gpt2_layout;
  return adapter;
}

HuggingFaceAdapter llama_hugging_face() {
  HuggingFaceAdapter adapter;
  adapter.model_type = "llama";
  adapter.architecture = "LlamaForCausalLM";
  adapter.read_config = read_llama;
  adapter.write_config = write_llama;
  adapter.layout = llama_layout;
  return adapter;
}

}  // namespace dtrain::train
