// config.json for GPT-2 and Llama (include/dtrain/hugging_face.h): read into
// dtrain's model configurations, and written back for transformers.
#include "dtrain/hugging_face.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace dtrain::hf {
namespace {

using nlohmann::json;

class ConfigReader {
 public:
  ConfigReader(std::string path, json fields) : path_(std::move(path)), fields_(std::move(fields)) {}

  [[noreturn]] void fail(const std::string& what) const { throw std::invalid_argument(path_ + ": " + what); }

  bool has(const char* key) const { return fields_.contains(key) && !fields_[key].is_null(); }

  int64_t integer(const char* key) const {
    if (!has(key)) fail(std::string("\"") + key + "\" is missing");
    const json& value = fields_[key];
    if (!value.is_number_integer() || value.get<int64_t>() < 1)
      fail(std::string("\"") + key + "\" must be a positive integer, got " + value.dump());
    return value.get<int64_t>();
  }
  int64_t integer(const char* key, int64_t otherwise) const { return has(key) ? integer(key) : otherwise; }

  double number(const char* key, double otherwise) const {
    if (!has(key)) return otherwise;
    if (!fields_[key].is_number()) fail(std::string("\"") + key + "\" must be a number, got " + fields_[key].dump());
    return fields_[key].get<double>();
  }

  bool boolean(const char* key, bool otherwise) const {
    if (!has(key)) return otherwise;
    if (!fields_[key].is_boolean()) fail(std::string("\"") + key + "\" must be true or false, got " + fields_[key].dump());
    return fields_[key].get<bool>();
  }

  std::string text(const char* key, const std::string& otherwise) const {
    if (!has(key)) return otherwise;
    if (!fields_[key].is_string()) fail(std::string("\"") + key + "\" must be a string, got " + fields_[key].dump());
    return fields_[key].get<std::string>();
  }

  // A field dtrain's model does not compute: refused unless it has the one value it supports.
  template <class T>
  void require(const char* key, const T& supported, const std::string& why) const {
    if (has(key) && fields_[key] != json(supported))
      fail(std::string("\"") + key + "\": " + fields_[key].dump() + " is not supported (" + why + ")");
  }

  const json& fields() const { return fields_; }

 private:
  std::string path_;
  json fields_;
};

ModelConfig read_gpt2(const ConfigReader& r) {
  ModelConfig config;
  models::GPTConfig& g = config.gpt;
  g.vocab_size = r.integer("vocab_size");
  g.seq_len = r.integer("n_positions", r.integer("n_ctx", 1024));
  g.n_embd = r.integer("n_embd");
  g.n_layer = r.integer("n_layer");
  g.n_head = r.integer("n_head");
  if (g.n_embd % g.n_head != 0) r.fail("n_head " + std::to_string(g.n_head) + " does not divide n_embd " + std::to_string(g.n_embd));
  if (r.has("n_inner") && r.integer("n_inner") != 4 * g.n_embd)
    r.fail("\"n_inner\": " + std::to_string(r.integer("n_inner")) + " is not supported (dtrain's GPT-2 MLP is 4 x n_embd = " +
           std::to_string(4 * g.n_embd) + " wide)");
  g.layer_norm_eps = r.number("layer_norm_epsilon", 1e-5);
  const std::string activation = r.text("activation_function", "gelu_new");
  if (activation == "gelu_new" || activation == "gelu_pytorch_tanh") {
    config.model = "gpt2";
    g.gelu_tanh = true;
  } else if (activation == "gelu") {
    config.model = "gpt";  // GPT-2's layout with the exact GELU: dtrain's own GPT
  } else {
    r.fail("\"activation_function\": \"" + activation + "\" is not supported (gelu_new, gelu_pytorch_tanh or gelu)");
  }
  r.require("scale_attn_weights", true, "attention scores are scaled by 1/sqrt(head_dim)");
  r.require("scale_attn_by_inverse_layer_idx", false, "no per-layer scaling");
  r.require("add_cross_attention", false, "a decoder-only model");
  r.require("tie_word_embeddings", true, "GPT-2's head is its token embedding");
  return config;
}

ModelConfig read_llama(const ConfigReader& r) {
  ModelConfig config;
  config.model = "llama";
  models::LlamaConfig& l = config.llama;
  l.vocab_size = r.integer("vocab_size");
  l.seq_len = r.integer("max_position_embeddings", 2048);
  l.dim = r.integer("hidden_size");
  l.n_layer = r.integer("num_hidden_layers");
  l.n_head = r.integer("num_attention_heads");
  l.n_kv_head = r.integer("num_key_value_heads", l.n_head);
  l.ffn_dim = r.integer("intermediate_size");
  l.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  l.tie_embeddings = r.boolean("tie_word_embeddings", false);
  l.dropout = r.number("attention_dropout", 0.0);
  // rope_theta: a top-level field, or (newer files) inside rope_parameters.
  l.rope_theta = r.number("rope_theta", 10000.0);
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (!r.has(key)) continue;
    const json& rope = r.fields()[key];
    if (!rope.is_object()) r.fail(std::string("\"") + key + "\" must be an object");
    const std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
    if (type != "default")
      r.fail(std::string("\"") + key + "\": rope_type \"" + type + "\" is not supported (only the default rotary embedding)");
    if (rope.contains("rope_theta") && rope["rope_theta"].is_number()) l.rope_theta = rope["rope_theta"].get<double>();
  }
  if (l.dim % l.n_head != 0)
    r.fail("num_attention_heads " + std::to_string(l.n_head) + " does not divide hidden_size " + std::to_string(l.dim));
  if (r.has("head_dim") && r.integer("head_dim") != l.dim / l.n_head)
    r.fail("\"head_dim\": " + std::to_string(r.integer("head_dim")) + " is not supported (dtrain's heads are hidden_size / "
           "num_attention_heads = " + std::to_string(l.dim / l.n_head) + " wide)");
  r.require("hidden_act", "silu", "the SwiGLU MLP gates with SiLU");
  r.require("attention_bias", false, "Llama's projections have no biases");
  r.require("mlp_bias", false, "Llama's projections have no biases");
  return config;
}

}  // namespace

ModelConfig read_config(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::invalid_argument(path + ": cannot be read");
  std::stringstream text;
  text << file.rdbuf();
  return parse_config(text.str(), path);
}

ModelConfig parse_config(const std::string& text, const std::string& path) {
  json fields = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!fields.is_object()) throw std::invalid_argument(path + ": is not a JSON object (a Hugging Face config.json)");
  const ConfigReader reader(path, fields);
  const std::string type = reader.text("model_type", "");
  ModelConfig config;
  if (type == "gpt2") {
    config = read_gpt2(reader);
  } else if (type == "llama") {
    config = read_llama(reader);
  } else {
    reader.fail("model_type \"" + type + "\" is not one dtrain builds (gpt2, llama)");
  }
  config.json = text;
  return config;
}

std::string config_json(const ModelConfig& config, const std::string& base) {
  json fields = base.empty() ? json::object() : json::parse(base, nullptr, false);
  if (!fields.is_object()) fields = json::object();
  if (config.model == "llama") {
    const models::LlamaConfig& l = config.llama;
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
  } else if (config.model == "gpt" || config.model == "gpt2") {
    const models::GPTConfig& g = config.gpt;
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
  } else {
    throw std::invalid_argument("a Hugging Face config.json describes gpt, gpt2 or llama, not --model " + config.model);
  }
  if (!fields.contains("initializer_range")) fields["initializer_range"] = 0.02;
  fields["torch_dtype"] = "float32";
  fields.erase("dtype");
  return fields.dump(2) + "\n";
}

bool is_model_directory(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_directory(path, error) &&
         std::filesystem::is_regular_file(std::filesystem::path(path) / "config.json", error);
}

}  // namespace dtrain::hf
