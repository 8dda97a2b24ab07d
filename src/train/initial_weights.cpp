#include "train/initial_weights.h"

#include "checkpoint/held_state.h"
#include "dtrain/checkpoint.h"
#include "dtrain/hugging_face.h"
#include "dtrain/model_spec.h"
#include "dtrain/train.h"
#include "train/model.h"

#include <stdexcept>

namespace dtrain {
namespace train {
namespace {

hf::Layout hugging_face_layout_or_refuse(const HuggingFaceLayout& layout, const std::string& path) {
  if (!layout)
    throw std::invalid_argument("--init-from " + path + " is a Hugging Face model directory, and the model's spec does "
                                "not read one (ModelSpec::hugging_face)");
  return layout();
}

}  // namespace

void load_initial_weights(const HeldModel& held, const std::string& path, const HuggingFaceLayout& layout) {
  const bool directory = hf::is_model_directory(path);
  const hf::Layout names = directory ? hugging_face_layout_or_refuse(layout, path) : hf::Layout{};
  try {
    if (directory) return hf::load_into(held, names, path);
    load_safetensors_into(held, path);
  } catch (const std::runtime_error& error) {
    throw std::invalid_argument(std::string("--init-from: ") + error.what());
  }
}

void load_initial_weights(torch::nn::Module& module, const std::string& path, const HuggingFaceLayout& layout) {
  if (hf::is_model_directory(path)) return load_initial_weights(detail::held_by_module(module, nullptr), path, layout);
  try {
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
    if (hf::is_model_directory(config.init_from))
      return hf::check_fits(*model.module, train::hugging_face_layout_or_refuse(model.hugging_face_layout, config.init_from),
                            config.init_from);
    check_safetensors_fits(*model.module, config.init_from);
  } catch (const std::runtime_error& error) {
    throw std::invalid_argument(std::string("--init-from: ") + error.what());
  }
}

}  // namespace dtrain
