// dtrain's logits for a batch, from a Hugging Face model directory or from
// a dtrain safetensors file (check_hugging_face.py compares them with
// transformers'):
//
//   hf_logits MODEL_DIR TOKENS.safetensors OUT.safetensors [WEIGHTS.safetensors]
//
// Builds the model config.json in MODEL_DIR describes; loads its weights
// from MODEL_DIR through dtrain::hf::load_into, or (given WEIGHTS) from a
// file in dtrain's names (`dtrain checkpoint export` without --format).
// TOKENS holds "tokens", int64 [B,T]; OUT gets "logits", fp32 [B,T,V].
#include <dtrain/hugging_face.h>
#include <dtrain/llama.h>
#include <dtrain/models.h>
#include <dtrain/safetensors.h>

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
    const auto config = dtrain::hf::read_config((std::filesystem::path(dir) / "config.json").string());
    std::shared_ptr<torch::nn::Module> module;
    std::function<torch::Tensor(const torch::Tensor&)> forward;
    if (config.model == "llama") {
      dtrain::models::Llama llama(config.llama);
      module = llama.ptr();
      forward = [llama](const torch::Tensor& tokens) mutable { return llama->forward(tokens); };
    } else {
      dtrain::models::GPT gpt(config.gpt);
      module = gpt.ptr();
      forward = [gpt](const torch::Tensor& tokens) mutable { return gpt->forward(tokens); };
    }
    if (argc == 5) {
      dtrain::load_state_into(*module, dtrain::load_safetensors(argv[4]));
    } else {
      dtrain::HeldModel held;
      for (const auto& item : module->named_parameters(true)) {
        const auto& p = item.value();
        held.tensors.push_back({item.key(), p.sizes().vec(), 0, p.numel(), p.detach().view(-1), 1, 0, p, {}});
      }
      dtrain::hf::load_into(held, config.model, dir);
    }
    module->eval();
    torch::NoGradGuard no_grad;
    const auto tokens = dtrain::load_safetensors(argv[2]).at("tokens");
    dtrain::save_safetensors(argv[3], {{"logits", forward(tokens)}});
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "hf_logits: " << error.what() << "\n";
    return 1;
  }
}
