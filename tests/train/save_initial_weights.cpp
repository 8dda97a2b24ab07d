// Writes the weights `dtrain train` would start from, for check_init_from.py:
//   save_initial_weights OUT.safetensors SEED seeded|zeros mlp HIDDEN,...
//   save_initial_weights OUT.safetensors SEED seeded|zeros gpt LAYERS DIM HEADS SEQ_LEN
// seeded: the model run_training builds with --seed SEED; zeros: every
// parameter and buffer zero.
#include "dtrain/checkpoint.h"
#include "dtrain/train.h"
#include "train/model.h"

#include <torch/torch.h>

#include <iostream>
#include <sstream>
#include <string>

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  const bool mlp = args.size() == 5 && args[3] == "mlp", gpt = args.size() == 8 && args[3] == "gpt";
  if ((!mlp && !gpt) || (args[2] != "seeded" && args[2] != "zeros")) {
    std::cerr << "usage: save_initial_weights OUT SEED seeded|zeros (mlp HIDDEN,... | gpt LAYERS DIM HEADS SEQ_LEN)\n";
    return 2;
  }
  dtrain::TrainConfig config;
  config.model = args[3];
  if (mlp) {
    config.mlp_hidden.clear();
    std::istringstream widths(args[4]);
    for (std::string width; std::getline(widths, width, ',');) config.mlp_hidden.push_back(std::stoll(width));
  } else {
    config.gpt_layers = std::stoll(args[4]);
    config.gpt_dim = std::stoll(args[5]);
    config.gpt_heads = std::stoll(args[6]);
    config.seq_len = std::stoll(args[7]);
  }
  torch::manual_seed(std::stoull(args[1]));  // as run_training does
  const auto model = dtrain::train::build_model(config);
  if (args[2] == "zeros") {
    torch::NoGradGuard no_grad;
    for (auto& tensor : model.module->parameters()) tensor.zero_();
    for (auto& tensor : model.module->buffers()) tensor.zero_();
  }
  dtrain::save_module_safetensors(*model.module, args[0], {{"model", config.model}, {"init", args[2]}});
  return 0;
}
