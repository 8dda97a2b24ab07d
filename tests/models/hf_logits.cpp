// dtrain's logits for a batch, from a Hugging Face model directory or from
// a dtrain safetensors file (check_hugging_face.py compares them with
// transformers'):
//
//   hf_logits MODEL_DIR TOKENS.safetensors OUT.safetensors [WEIGHTS.safetensors]
//
// Builds the registered model config.json in MODEL_DIR describes (through
// the spec's Hugging Face adapter, as dtrain train does); loads its weights
// from MODEL_DIR through dtrain::hf::load_into and the spec's layout, or
// (given WEIGHTS) from a file in dtrain's names (`dtrain checkpoint export`
// without --format).
// TOKENS holds "tokens", int64 [B,T]; OUT gets "logits", fp32 [B,T,V].
#include <dtrain/hugging_face.h>
#include <dtrain/model_spec.h>
#include <dtrain/safetensors.h>
#include <dtrain/train.h>

#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::cerr << "usage: hf_logits MODEL_DIR TOKENS.safetensors OUT.safetensors [WEIGHTS.safetensors]\n";
    return 2;
  }
  try {
    const std::string dir = argv[1];
    dtrain::TrainConfig config;
    config.model_config = (std::filesystem::path(dir) / "config.json").string();
    dtrain::apply_model_config(config);
    const dtrain::ModelSpec& spec = dtrain::find_model(config.model);
    const dtrain::BuiltModel model = spec.build(config);
    const std::shared_ptr<torch::nn::Module> module = model.module;
    if (argc == 5) {
      dtrain::load_state_into(*module, dtrain::load_safetensors(argv[4]));
    } else {
      dtrain::HeldModel held;
      for (const auto& item : module->named_parameters(true)) {
        const auto& p = item.value();
        held.tensors.push_back({item.key(), p.sizes().vec(), 0, p.numel(), p.detach().view(-1), 1, 0, p, {}});
      }
      dtrain::hf::load_into(held, spec.hugging_face->layout(), dir);
    }
    module->eval();
    torch::NoGradGuard no_grad;
    const auto tokens = dtrain::load_safetensors(argv[2]).at("tokens");
    dtrain::save_safetensors(argv[3], {{"logits", model.forward(tokens)}});
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "hf_logits: " << error.what() << "\n";
    return 1;
  }
}
