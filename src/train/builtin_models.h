// The five models dtrain ships (mlp, cnn, gpt, gpt2, llama) as model specs
// (dtrain/model_spec.h): with builtin_models.cpp and builtin_hugging_face.cpp,
// the only place a run learns what they are.
#pragma once

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
// The transformers' Hugging Face adapters (builtin_hugging_face.cpp): GPT-2's
// layout with the tanh GELU (gpt2) or the exact one (gpt), and Llama's.
HuggingFaceAdapter gpt2_hugging_face(bool tanh);
HuggingFaceAdapter llama_hugging_face();

}  // namespace dtrain::train
