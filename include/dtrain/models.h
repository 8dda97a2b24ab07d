// The models dtrain trains: MLP and CNN for 28x28 images (Fashion-MNIST) and
// GPT, a byte-level decoder-only transformer (the flagship model).
//
// They are ordinary torch::nn modules (TORCH_MODULE holders), so every engine
// (DDP, FSDP, parameter server) and a plain single-process loop take them as
// they are. Initial weights come from LibTorch's default generator: call
// torch::manual_seed(seed) before building one to make them reproducible.
// Each module is initialised from its own generator (dtrain/deferred_init.h),
// so they can be built deferred and materialised piece by piece by FSDP
// with the same weights.
#pragma once

#include <dtrain/deferred_init.h>
#include <dtrain/fsdp.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::models {

// Number of distinct parameter elements of a module and its children (a
// parameter registered twice is counted once).
int64_t parameter_count(const torch::nn::Module& module);

// Flatten -> [Linear -> ReLU -> Dropout] per hidden size -> Linear(10).
// Takes [B,1,28,28] (or [B,784]) float, returns logits [B,10].
class MLPImpl : public torch::nn::Module, public DeferredInit {
 public:
  explicit MLPImpl(std::vector<int64_t> hidden_sizes = {256, 256}, double dropout = 0.0);
  torch::Tensor forward(torch::Tensor images);

 private:
  torch::nn::Sequential layers_;
};
TORCH_MODULE(MLP);

// Two conv blocks (conv3x3 -> BatchNorm2d -> ReLU -> maxpool2: 1->16, 16->32
// channels) then Linear(32*7*7 -> 64) -> ReLU -> Linear(64 -> 10).
// Takes [B,1,28,28] float, returns logits [B,10]. BatchNorm's running
// statistics are buffers, which DDP must broadcast from rank 0.
class CNNImpl : public torch::nn::Module, public DeferredInit {
 public:
  CNNImpl();
  torch::Tensor forward(torch::Tensor images);

 private:
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::BatchNorm2d norm1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::BatchNorm2d norm2_{nullptr};
  torch::nn::Linear hidden_{nullptr}, output_{nullptr};
};
TORCH_MODULE(CNN);

struct GPTConfig {
  int64_t vocab_size = 256;  // bytes
  int64_t seq_len = 64;      // longest context (learned position embeddings)
  int64_t n_layer = 2;
  int64_t n_embd = 64;
  int64_t n_head = 4;        // must divide n_embd
  double dropout = 0.0;      // embeddings, attention weights, residual branches
  // GPT-2's flavour (Hugging Face's "gelu_new"): GELU with the tanh
  // approximation. dtrain's own GPT uses the exact GELU.
  bool gelu_tanh = false;
  double layer_norm_eps = 1e-5;
};

// The GPT's LayerNorm over n_embd (config.layer_norm_eps), deferred as the
// models build their modules, and its MLP activation (config.gelu_tanh).
torch::nn::LayerNorm gpt_layer_norm(const GPTConfig& config);
torch::Tensor gpt_activation(const GPTConfig& config, const torch::Tensor& x);

// One pre-norm transformer block:
//   x = x + attn_proj(causal_attention(qkv(ln_1(x))))
//   x = x + mlp_proj(gelu(mlp_fc(ln_2(x))))          (hidden width 4 * n_embd)
// Its own module so that FSDP can shard the model one block at a time.
class GPTBlockImpl : public torch::nn::Module {
 public:
  explicit GPTBlockImpl(const GPTConfig& config);
  // [B,T,C] -> [B,T,C]
  torch::Tensor forward(torch::Tensor x);

 private:
  int64_t n_head_;
  double dropout_;
  GPTConfig config_;
  torch::nn::LayerNorm ln_1_{nullptr};
  torch::nn::Linear qkv_{nullptr}, attn_proj_{nullptr};
  torch::nn::LayerNorm ln_2_{nullptr};
  torch::nn::Linear mlp_fc_{nullptr}, mlp_proj_{nullptr};
};
TORCH_MODULE(GPTBlock);

// Decoder-only transformer: token + position embeddings, n_layer GPTBlocks
// (the ModuleList "blocks"), final LayerNorm, and an output head tied to the
// token embedding (logits = x @ wte.weight^T; there is no head parameter).
// GPT-2 initialisation: Linear and Embedding weights ~ N(0, 0.02), biases 0.
class GPTImpl : public torch::nn::Module, public DeferredInit {
 public:
  explicit GPTImpl(const GPTConfig& config);

  // int64 tokens [B,T] with T <= seq_len -> logits [B,T,vocab_size]. The
  // logits at position t depend only on tokens 0..t.
  torch::Tensor forward(torch::Tensor tokens);

  // Appends max_new_tokens sampled tokens to prompt_tokens ([B,T0] or [T0]
  // int64) and returns the whole sequence, shaped like the prompt, on the
  // model's device. Each step sees the last seq_len tokens and samples from
  // softmax(logits / temperature) restricted to the top_k most likely tokens
  // (top_k <= 0: all); temperature <= 0 picks the most likely token. Runs in
  // eval mode without gradients and restores the training flag afterwards.
  // `forward`, when given, replaces this->forward (e.g. a sharded engine's
  // call, which gathers the weights; every rank then runs the loop).
  torch::Tensor generate(torch::Tensor prompt_tokens, int64_t max_new_tokens, double temperature = 1.0,
                         int64_t top_k = 0, std::optional<at::Generator> generator = std::nullopt,
                         const std::function<torch::Tensor(const torch::Tensor&)>& forward = nullptr);

  const GPTConfig& config() const { return config_; }

  // GPT-2's initialisation of each module (see above); LayerNorms as LibTorch.
  void init_module(const std::string& name, torch::nn::Module& module, at::Generator& generator) override;

  // parameter_count(GPT(config)) without building the model:
  //   vocab*C + seq_len*C + n_layer*(12*C^2 + 13*C) + 2*C   (C = n_embd).
  static int64_t parameter_count(const GPTConfig& config);

 private:
  GPTConfig config_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};               // registers the blocks ("blocks.0", ...)
  std::vector<dtrain::Sharded<GPTBlock>> block_calls_;  // calls them (as FSDP units when sharded)
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(GPT);

}  // namespace dtrain::models
