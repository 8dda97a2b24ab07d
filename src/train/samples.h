// Text a trained GPT writes, for a person to judge at the end of a run.
#pragma once

#include "dtrain/models.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dtrain::data {
class Tokenizer;
}

namespace dtrain::train {

struct SampleOptions {
  int64_t count = 3;
  int64_t bytes = 200;          // new bytes per sample
  std::string prompt = "The ";  // every sample starts from it
  double temperature = 0.8;
  uint64_t seed = 0;
  // Encodes the prompt and decodes the samples; nullptr: bytes (ids 0-255).
  const data::Tokenizer* tokenizer = nullptr;
  // ModelSpec::sample (prompts, new tokens, generator, forward -> tokens);
  // unset: models::sample_continuations at `temperature`.
  std::function<torch::Tensor(const torch::Tensor&, int64_t, at::Generator,
                              const std::function<torch::Tensor(const torch::Tensor&)>&)>
      sampler;
};

// `count` continuations of the prompt, prompt included, sampled from a
// generator seeded with `seed`: the same on every rank, so all ranks can run
// it in step (engines that communicate in forward need that).
// `forward` runs the model (through the training strategy, which may gather
// sharded weights) on at most `seq_len` tokens and returns logits whose last
// position covers the whole vocabulary; `model` is put in eval mode
// meanwhile. Every rank must call this, with the same options.
std::vector<std::string> generate_samples(torch::nn::Module& model, int64_t seq_len, const SampleOptions& options,
                                          const std::function<torch::Tensor(const torch::Tensor&)>& forward);

// The text with bytes a terminal cannot show (control bytes other than
// newline and tab, and bytes outside ASCII) replaced by '?'.
std::string printable(const std::string& text);

}  // namespace dtrain::train
