// Sampling text from a language model given only its forward function:
// what GPT::generate does, for models whose forward runs through an engine
// or across a tensor-parallel group (dtrain/tp_gpt.h).
#pragma once

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>

namespace dtrain::models {

// Appends max_new_tokens sampled tokens to prompt_tokens (int64 [B,T0]) and
// returns the whole sequence [B, T0 + max_new_tokens]. Each step runs
// `forward` on the last seq_len tokens ([B,T] -> logits whose last position
// [B,T,vocab] it samples from): softmax(logits / temperature) restricted to
// the top_k most likely tokens (top_k <= 0: all); temperature <= 0 picks the
// most likely token. The caller sets eval mode and disables gradients.
torch::Tensor sample_continuations(torch::Tensor prompt_tokens, int64_t max_new_tokens, int64_t seq_len,
                                   double temperature, int64_t top_k, std::optional<at::Generator> generator,
                                   const std::function<torch::Tensor(const torch::Tensor&)>& forward);

}  // namespace dtrain::models
