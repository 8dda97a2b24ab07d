// --init-from FILE.safetensors: a model's initial weights from a file.
#pragma once

#include <torch/nn/module.h>

#include <string>

namespace dtrain::train {

// Loads `path` into `module` (dtrain/checkpoint.h: load_state_into). Throws
// std::invalid_argument "--init-from: ..." naming the file and what does not
// fit, leaving the module unchanged: a file that does not fit the model is a
// bad flag, not a failed run.
void load_initial_weights(torch::nn::Module& module, const std::string& path);

}  // namespace dtrain::train
