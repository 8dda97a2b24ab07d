#include "train/samples.h"

#include "dtrain/sampling.h"
#include "dtrain/tokenizer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <stdexcept>

namespace dtrain::train {

std::vector<std::string> generate_samples(torch::nn::Module& model, int64_t seq_len, const SampleOptions& options,
                                          const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
  if (options.count <= 0) return {};  // no model call on an empty batch (Note [no empty batches])
  std::vector<int64_t> prompt(options.prompt.begin(), options.prompt.end());
  for (auto& byte : prompt) byte &= 0xff;  // chars may be signed
  if (options.tokenizer) prompt = options.tokenizer->encode(options.prompt);
  auto prompts = torch::tensor(prompt, torch::kLong).unsqueeze(0).repeat({options.count, 1});
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  // Dropout off while sampling; training's mode comes back even if forward throws.
  struct RestoreMode {
    torch::nn::Module& module;
    bool was_training;
    ~RestoreMode() { module.train(was_training); }
  } restore_mode{model, model.is_training()};
  model.eval();
  torch::NoGradGuard no_grad;
  auto tokens = (options.sampler ? options.sampler(prompts, options.bytes, generator, forward)
                                 : models::sample_continuations(prompts, options.bytes, seq_len, options.temperature,
                                                                /*top_k=*/0, generator, forward))
                    .contiguous();
  if (tokens.dim() != 2 || tokens.size(0) != options.count || tokens.size(1) != prompts.size(1) + options.bytes)
    throw std::runtime_error("ModelSpec::sample returned tokens of shape " + c10::str(tokens.sizes()) + ", not [" +
                             std::to_string(options.count) + ", " + std::to_string(prompts.size(1) + options.bytes) +
                             "] (the prompts and the new tokens)");
  std::vector<std::string> samples;
  for (int64_t i = 0; i < options.count; ++i) {
    if (options.tokenizer) {
      // A model's vocabulary may be padded past the tokenizer's: such ids have no text.
      const auto row = tokens[i].to(torch::kLong).contiguous();
      std::vector<int64_t> ids;
      for (const int64_t* id = row.data_ptr<int64_t>(); id != row.data_ptr<int64_t>() + row.numel(); ++id)
        if (*id < options.tokenizer->vocab_size()) ids.push_back(*id);
      samples.push_back(options.tokenizer->decode(ids));
      continue;
    }
    auto row = tokens[i].to(torch::kUInt8).contiguous();
    samples.emplace_back(reinterpret_cast<const char*>(row.data_ptr<uint8_t>()), static_cast<size_t>(row.numel()));
  }
  return samples;
}

std::string printable(const std::string& text) {
  std::string shown = text;
  for (char& c : shown) {
    const auto byte = static_cast<unsigned char>(c);
    if ((byte < 0x20 && c != '\n' && c != '\t') || byte >= 0x7f) c = '?';
  }
  return shown;
}

}  // namespace dtrain::train
