// One pipeline stage of models::GPT (pipeline parallelism, dtrain/pipeline.h):
// consecutive blocks, with the embeddings on the first stage and ln_f and the
// tied head on the last. Its modules carry GPT's names ("wte", "blocks.5",
// "ln_f"), and each is initialised from the generator its name gives
// (dtrain/deferred_init.h), so the stages built after torch::manual_seed(s)
// hold exactly the weights of GPT(config) built after the same seed, and a
// checkpoint's names are GPT's.
//
// The head is tied to the token embedding. With more than one stage the
// last one holds its own copy of wte (equal at the start); after each
// backward, sum the two copies' gradients over the first and last stage
// (pp::sum_tied_gradients) so that both take the same step as GPT's one wte.
#pragma once

#include <dtrain/models.h>

namespace dtrain::models {

class GPTStageImpl : public torch::nn::Module, public DeferredInit {
 public:
  // Stage `stage` of `stages`, holding blocks [first_block, last_block).
  GPTStageImpl(const GPTConfig& config, int stage, int stages, int64_t first_block, int64_t last_block);

  // First stage: int64 tokens [B,T] -> [B,T,C]. Others: [B,T,C] -> [B,T,C],
  // and the last -> logits [B,T,vocab_size]. With one stage, GPT::forward.
  torch::Tensor forward(torch::Tensor input);

  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ == stages_ - 1; }
  // wte's weight on the stages that hold it (the first and the last); else undefined.
  torch::Tensor tied_weight() const { return wte_ ? wte_->weight : torch::Tensor(); }
  const GPTConfig& config() const { return config_; }

  void init_module(const std::string& name, torch::nn::Module& module, at::Generator& generator) override;

 private:
  GPTConfig config_;
  int stage_, stages_;
  torch::nn::Embedding wte_{nullptr}, wpe_{nullptr};
  std::vector<dtrain::Sharded<GPTBlock>> block_calls_;
  torch::nn::LayerNorm ln_f_{nullptr};
};
TORCH_MODULE(GPTStage);

// What every GPT stage (GPTStage, TPGPTStage) checks. check_stage: the
// config is GPT's and the stage and its blocks fit it (std::invalid_argument
// naming `what` and the numbers). stage_positions: the first stage's input
// is int64 tokens [B,T] with T <= seq_len; returns the positions 0..T-1.
void check_stage(const GPTConfig& config, int stage, int stages, int64_t first_block, int64_t last_block,
                 const std::string& what);
torch::Tensor stage_positions(const torch::Tensor& tokens, const GPTConfig& config, const std::string& what);

// GPT-2's initialisation of one module, as GPT::init_module does it.
void init_gpt_module(torch::nn::Module& module, at::Generator& generator);

}  // namespace dtrain::models
