// --init-from: a model's initial weights from a safetensors file or a
// Hugging Face model directory.
#pragma once

#include "dtrain/checkpoint.h"

#include <torch/nn/module.h>

#include <functional>
#include <string>

namespace dtrain {
namespace hf {
struct Layout;
}
namespace train {

// The Hugging Face layout of the run's model (its spec's
// HuggingFaceAdapter::layout); unset when the spec has no adapter.
using HuggingFaceLayout = std::function<hf::Layout()>;

// Loads `path` into what this rank holds (a whole module, FSDP's shards, a
// mesh's slices): a safetensors file in dtrain's names, or a Hugging Face
// model directory through `layout`. Throws std::invalid_argument
// "--init-from: ..." naming the file and what does not fit, before anything
// is read: a file that does not fit the model is a bad flag, not a failed run.
void load_initial_weights(const HeldModel& held, const std::string& path, const HuggingFaceLayout& layout);
// The same for a whole module (dtrain/checkpoint.h: load_state_into).
void load_initial_weights(torch::nn::Module& module, const std::string& path, const HuggingFaceLayout& layout);

}  // namespace train
}  // namespace dtrain
