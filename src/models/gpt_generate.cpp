#include "dtrain/models.h"
#include "dtrain/sampling.h"

#include <torch/utils.h>

#include <limits>

namespace dtrain::models {

// Plain sampling: every new token reruns the model over the whole context
// (no key/value cache). Generation is for looking at what a trained model
// writes, where this cost does not matter, and keeps forward the only path.
torch::Tensor GPTImpl::generate(torch::Tensor prompt_tokens, int64_t max_new_tokens, double temperature,
                                int64_t top_k, std::optional<at::Generator> generator,
                                const std::function<torch::Tensor(const torch::Tensor&)>& forward_fn) {
  TORCH_CHECK(prompt_tokens.scalar_type() == torch::kLong && (prompt_tokens.dim() == 1 || prompt_tokens.dim() == 2),
              "GPT::generate: expected int64 prompt tokens of shape [B,T] or [T], got ", prompt_tokens.scalar_type(),
              " ", prompt_tokens.sizes());
  TORCH_CHECK(prompt_tokens.size(-1) > 0, "GPT::generate: the prompt is empty");
  TORCH_CHECK(max_new_tokens >= 0, "GPT::generate: max_new_tokens must be >= 0, got ", max_new_tokens);

  // Dropout off while sampling; the caller's mode comes back even if forward throws.
  struct RestoreMode {
    torch::nn::Module& module;
    bool was_training;
    ~RestoreMode() { module.train(was_training); }
  } restore_mode{*this, is_training()};
  eval();
  torch::NoGradGuard no_grad;

  const bool one_sequence = prompt_tokens.dim() == 1;
  auto tokens = (one_sequence ? prompt_tokens.unsqueeze(0) : prompt_tokens).to(wte_->weight.device());
  tokens = sample_continuations(tokens, max_new_tokens, config_.seq_len, temperature, top_k, generator,
                                [&](const torch::Tensor& context) {
                                  return forward_fn ? forward_fn(context) : forward(context);
                                });
  return one_sequence ? tokens.squeeze(0) : tokens;
}

torch::Tensor sample_continuations(torch::Tensor tokens, int64_t max_new_tokens, int64_t seq_len, double temperature,
                                   int64_t top_k, std::optional<at::Generator> generator,
                                   const std::function<torch::Tensor(const torch::Tensor&)>& forward) {
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int64_t T = tokens.size(1);
    auto context = T > seq_len ? tokens.narrow(1, T - seq_len, seq_len) : tokens;
    auto logits = forward(context).select(1, -1).to(torch::kFloat);  // [B,vocab]
    torch::Tensor next;
    if (temperature <= 0.0) {
      next = logits.argmax(-1, /*keepdim=*/true);
    } else {
      logits = logits / temperature;
      if (top_k > 0 && top_k < logits.size(-1)) {
        auto kth_largest = std::get<0>(logits.topk(top_k, -1)).narrow(-1, top_k - 1, 1);
        logits = logits.masked_fill(logits < kth_largest, -std::numeric_limits<float>::infinity());
      }
      next = torch::multinomial(logits.softmax(-1), 1, /*replacement=*/false, generator);
    }
    tokens = torch::cat({tokens, next}, 1);
  }
  return tokens;
}

}  // namespace dtrain::models
