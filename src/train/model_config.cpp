// apply_model_config (include/dtrain/train.h): a Hugging Face config.json
// decides the transformer's architecture.
#include "dtrain/hugging_face.h"
#include "dtrain/model_spec.h"
#include "dtrain/train.h"

#include <filesystem>
#include <stdexcept>

namespace dtrain {

bool is_language_model(const std::string& model) { return has_model(model) && find_model(model).token_sequences; }

std::string model_config_path(const TrainConfig& config) {
  if (!config.model_config.empty()) return config.model_config;
  if (!config.init_from.empty() && hf::is_model_directory(config.init_from))
    return (std::filesystem::path(config.init_from) / "config.json").string();
  return "";
}

void apply_model_config(TrainConfig& config) {
  const std::string path = model_config_path(config);
  if (path.empty()) return;
  // A model of one's own does not come from a config.json (the default
  // --model does: the file decides the transformer).
  if (has_model(config.model) && !find_model(config.model).hugging_face && config.model != TrainConfig{}.model)
    throw std::invalid_argument(path + " is a Hugging Face config.json, and --model " + config.model +
                                "'s spec does not read one (ModelSpec::hugging_face): leave out --model-config and a "
                                "model directory as --init-from");
  const hf::ModelConfig hf = hf::read_config(path);
  if (has_model(config.model) && find_model(config.model).hugging_face && config.model != hf.model) {
    const std::string why = hf.model == "gpt" && config.model == "gpt2"
                                ? " (GPT-2's layout with the exact GELU, activation_function \"gelu\": dtrain's own GPT)"
                                : "";
    throw std::invalid_argument(path + " describes --model " + hf.model + why + ", not --model " + config.model +
                                ": pass --model " + hf.model + " or leave --model out");
  }
  config.model = hf.model;
  if (hf.model == "llama") {
    const models::LlamaConfig& l = hf.llama;
    config.vocab_size = l.vocab_size;
    config.positions = l.seq_len;
    config.gpt_layers = l.n_layer;
    config.gpt_dim = l.dim;
    config.gpt_heads = l.n_head;
    config.kv_heads = l.n_kv_head;
    config.ffn_dim = l.ffn_dim;
    config.rope_theta = l.rope_theta;
    config.norm_eps = l.rms_norm_eps;
    config.tie_embeddings = l.tie_embeddings;
  } else {
    const models::GPTConfig& g = hf.gpt;
    config.vocab_size = g.vocab_size;
    config.positions = g.seq_len;
    config.gpt_layers = g.n_layer;
    config.gpt_dim = g.n_embd;
    config.gpt_heads = g.n_head;
    config.norm_eps = g.layer_norm_eps;
  }
  config.model_config_json = hf.json;
}

}  // namespace dtrain
