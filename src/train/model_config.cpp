// apply_model_config (include/dtrain/train.h): a Hugging Face config.json
// decides the model and its architecture, through the registered specs'
// Hugging Face adapters (ModelSpec::hugging_face).
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

std::string model_for_hugging_face(const hf::Config& file) {
  const std::string type = file.model_type();
  std::string first_reader, types;
  for (const std::string& name : model_names()) {
    const ModelSpec& spec = find_model(name);
    if (!spec.hugging_face) continue;
    const HuggingFaceAdapter& adapter = *spec.hugging_face;
    if (types.find("\"" + adapter.model_type + "\"") == std::string::npos)
      types += (types.empty() ? "" : ", ") + ("\"" + adapter.model_type + "\"");
    if (adapter.model_type != type) continue;
    if (!adapter.describes || adapter.describes(file)) return name;
    if (first_reader.empty()) first_reader = name;
  }
  if (!first_reader.empty()) return first_reader;  // its read_config names what it cannot build
  file.fail("model_type \"" + type + "\" is not one a registered model reads (" + types + ")");
}

void apply_model_config(TrainConfig& config) {
  const std::string path = model_config_path(config);
  if (path.empty()) return;
  // A model of one's own without an adapter does not come from a config.json
  // (the default --model does: the file decides the model).
  if (has_model(config.model) && !find_model(config.model).hugging_face && config.model != TrainConfig{}.model)
    throw std::invalid_argument(path + " is a Hugging Face config.json, and --model " + config.model +
                                "'s spec does not read one (ModelSpec::hugging_face): leave out --model-config and a "
                                "model directory as --init-from");
  const hf::Config file = hf::Config::read(path);
  const std::string model = model_for_hugging_face(file);
  if (has_model(config.model) && find_model(config.model).hugging_face && config.model != model)
    throw std::invalid_argument(path + " describes --model " + model + " (" + find_model(model).summary +
                                "), not --model " + config.model + ": pass --model " + model + " or leave --model out");
  config.model = model;
  find_model(model).hugging_face->read_config(file, config);
  config.model_config_json = file.text();
}

}  // namespace dtrain
