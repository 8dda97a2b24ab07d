#include "train/initial_weights.h"

#include "checkpoint/held_state.h"
#include "dtrain/checkpoint.h"
#include "dtrain/hugging_face.h"
#include "dtrain/train.h"
#include "train/model.h"

#include <stdexcept>

namespace dtrain {
namespace train {

void load_initial_weights(torch::nn::Module& module, const std::string& path) {
  try {
    if (hf::is_model_directory(path)) return load_safetensors_into(detail::held_by_module(module, nullptr), path);
    load_state_into(module, load_safetensors(path));
  } catch (const std::runtime_error& error) {
    throw std::invalid_argument(std::string("--init-from: ") + error.what());
  }
}

}  // namespace train

void check_init_from(const TrainConfig& config) {
  if (config.init_from.empty()) return;
  // Deferred: the model's names, shapes and dtypes without its memory, and
  // only the file's header.
  // The file holds the whole model, also under --tp: checked against the unsplit one.
  TrainConfig whole = config;
  whole.tp = 1;
  whole.sequence_parallel = false;
  const train::Model model = train::build_model(whole, /*deferred=*/true);
  try {
    if (hf::is_model_directory(config.init_from)) return hf::check_fits(*model.module, config.model, config.init_from);
    check_safetensors_fits(*model.module, config.init_from);
  } catch (const std::runtime_error& error) {
    throw std::invalid_argument(std::string("--init-from: ") + error.what());
  }
}

}  // namespace dtrain
