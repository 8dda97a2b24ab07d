// The five models dtrain ships (mlp, cnn, gpt, gpt2, llama) as model specs
// (dtrain/model_spec.h): the only place a run learns what they are.
#pragma once

#include "dtrain/hugging_face.h"
#include "dtrain/llama.h"
#include "dtrain/model_spec.h"
#include "dtrain/models.h"
#include "dtrain/train.h"

#include <functional>
#include <string>

namespace dtrain::train {

// Adds each built-in spec through `add` (register_model's insertion; Note
// [built-in models are registered lazily] in model_registry.cpp says why the
// registry calls this rather than a static registrar).
void register_builtin_models(const std::function<void(const std::string&, ModelSpec)>& add);

// The transformers' shared flags fit together (--gpt-layers, --gpt-dim,
// --gpt-heads, --seq-len, --positions); `llama` adds its own.
void check_transformer_flags(const TrainConfig& config, bool llama);

// The GPT that --gpt-layers, --gpt-dim, --gpt-heads, --seq-len, --dropout
// describe (gpt, gpt2; gpt2 with GPT-2's tanh GELU).
models::GPTConfig gpt_config(const TrainConfig& config);
// The Llama the same flags, --kv-heads, --ffn-dim, --rope-theta describe.
models::LlamaConfig llama_config(const TrainConfig& config);
// The model as config.json describes it (gpt, gpt2, llama), on the file the
// run was configured from when there is one: checkpoints keep it for
// `dtrain checkpoint export --format hf`.
hf::ModelConfig hf_model_config(const TrainConfig& config);

}  // namespace dtrain::train
