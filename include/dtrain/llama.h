// The Llama family: a decoder-only transformer with RMSNorm, rotary position
// embeddings, a SwiGLU MLP, grouped-query attention and (usually) an untied
// output head, as Hugging Face's LlamaForCausalLM computes it, so that its
// checkpoints load unchanged (dtrain/hugging_face.h).
//
// The modules are named as Hugging Face names them, less the "model." prefix
// of the body: "embed_tokens", "layers.N.self_attn.q_proj", ..., "norm",
// "lm_head". Each block ("layers.N") is an FSDP unit, as the GPT's are, so
// every strategy trains it unchanged.
//
// A pipeline stage (LlamaPart) is the same class holding consecutive blocks,
// with embed_tokens on the first stage and norm and the head on the last,
// under the whole model's names, each module initialised from the generator
// its name gives: the stages built after torch::manual_seed(s) hold exactly
// the weights of Llama(config) built after the same seed. With tied
// embeddings and several stages the last stage holds its own copy of
// embed_tokens (equal at the start, an FSDP unit of its own on both ends);
// pp::sum_tied_gradients sums the copies' gradients after each backward.
#pragma once

#include <dtrain/deferred_init.h>
#include <dtrain/fsdp.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::models {

struct LlamaConfig {
  int64_t vocab_size = 256;
  int64_t seq_len = 128;    // longest context (Hugging Face's max_position_embeddings)
  int64_t n_layer = 2;
  int64_t dim = 64;         // hidden_size
  int64_t n_head = 4;       // query heads; must divide dim
  int64_t n_kv_head = 4;    // key/value heads (grouped-query attention): must divide n_head
  int64_t ffn_dim = 0;      // the SwiGLU MLP's width (intermediate_size); 0: default_ffn_dim(dim)
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_embeddings = false;  // the head is embed_tokens (no lm_head parameter)
  double dropout = 0.0;         // on the attention weights (attention_dropout)
};

// Which part of the model a pipeline stage holds: stage `stage` of `stages`,
// blocks [first_block, last_block). The default is the whole model.
struct LlamaPart {
  int stage = 0;
  int stages = 1;
  int64_t first_block = 0;
  int64_t last_block = -1;  // -1: n_layer
  bool is_first() const { return stage == 0; }
  bool is_last() const { return stage == stages - 1; }
};

// Checks a LlamaConfig (std::invalid_argument naming the field) and, when
// given, that `part` fits it; returns the part with last_block resolved.
LlamaPart check_llama(const LlamaConfig& config, LlamaPart part = {});

// 8/3 x dim rounded up to a multiple of 64: Llama's MLP width rule, less the
// final rounding to 256 that only the large models need.
int64_t default_ffn_dim(int64_t dim);

// y = x / sqrt(mean(x^2) + eps) * weight over the last dimension, computed
// in fp32 and cast back (as Hugging Face's LlamaRMSNorm). Weight starts at 1.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  void reset_parameters();
  double eps() const { return eps_; }
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// Causal self-attention with rotary embeddings on q and k (the half-split
// convention: the first head_dim/2 features rotate with the second half) and
// n_head / n_kv_head query heads sharing each key/value head.
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaConfig& config);
  // x [B,T,dim]; cos, sin [T,head_dim] (rotary_tables) -> [B,T,dim]
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

 private:
  LlamaConfig config_;
  torch::nn::Linear q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
};
TORCH_MODULE(LlamaAttention);

// down_proj(silu(gate_proj(x)) * up_proj(x)), no biases.
class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const LlamaConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

 private:
  torch::nn::Linear gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
};
TORCH_MODULE(LlamaMLP);

// x = x + self_attn(input_layernorm(x)); x = x + mlp(post_attention_layernorm(x))
class LlamaBlockImpl : public torch::nn::Module {
 public:
  explicit LlamaBlockImpl(const LlamaConfig& config);
  // [B,T,dim] -> [B,T,dim]; the rotary tables are computed from T.
  torch::Tensor forward(torch::Tensor x);

 private:
  LlamaConfig config_;
  RMSNorm input_layernorm_{nullptr};
  LlamaAttention self_attn_{nullptr};
  RMSNorm post_attention_layernorm_{nullptr};
  LlamaMLP mlp_{nullptr};
};
TORCH_MODULE(LlamaBlock);

// cos and sin [T, head_dim] for rotary embeddings with base theta, fp32: of
// `positions` (int64 [T], on their device), or of 0..T-1 on `device`.
std::pair<torch::Tensor, torch::Tensor> rotary_tables(const torch::Tensor& positions, int64_t head_dim, double theta);
std::pair<torch::Tensor, torch::Tensor> rotary_tables(int64_t T, int64_t head_dim, double theta,
                                                      const torch::Device& device);
// x [B,h,T,d] rotated by the tables [T,d]: x*cos + rotate_half(x)*sin, where
// rotate_half(x) = (-x2, x1) for x = (x1, x2) split at d/2.
torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// Hugging Face's initialisation of one Llama module (Linear and Embedding
// weights ~ N(0, 0.02), RMSNorm weights 1).
void init_llama_module(torch::nn::Module& module, at::Generator& generator);

// embed_tokens -> n_layer LlamaBlocks ("layers") -> norm -> lm_head (or the
// embedding's transpose when tied). Initialisation as Hugging Face's: Linear
// and Embedding weights ~ N(0, 0.02), RMSNorm weights 1.
class LlamaImpl : public torch::nn::Module, public DeferredInit {
 public:
  explicit LlamaImpl(const LlamaConfig& config, LlamaPart part = {});
  // int64 tokens [B,T], T <= seq_len -> logits [B,T,vocab_size]. A stage:
  // the first takes the tokens, the others the previous stage's [B,T,dim];
  // all but the last return [B,T,dim].
  torch::Tensor forward(torch::Tensor input);
  const LlamaConfig& config() const { return config_; }
  void init_module(const std::string& name, torch::nn::Module& module, at::Generator& generator) override;
  // parameter_count(Llama(config)) without building it.
  static int64_t parameter_count(const LlamaConfig& config);

 private:
  LlamaConfig config_;
  LlamaPart part_;
  torch::nn::Embedding embed_tokens_{nullptr};
  std::vector<dtrain::Sharded<LlamaBlock>> layer_calls_;
  RMSNorm norm_{nullptr};
  torch::nn::Linear lm_head_{nullptr};
};
TORCH_MODULE(Llama);

}  // namespace dtrain::models
