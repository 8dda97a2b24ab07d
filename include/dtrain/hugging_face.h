// Hugging Face model directories in and out: GPT-2 and Llama checkpoints
// that `transformers` writes with save_pretrained load into dtrain's models
// (models::GPT with GPT-2's GELU, models::Llama), and dtrain's checkpoints
// export to directories that `transformers` loads unchanged.
//
// A model directory holds config.json and either model.safetensors or
// model.safetensors.index.json (whose "weight_map" names the shard file of
// each tensor). Names map one to one:
//   GPT-2  transformer.wte.weight           <-> wte.weight
//          transformer.h.N.attn.c_attn.*    <-> blocks.N.qkv.*       (the weight transposed)
//          transformer.h.N.attn.c_proj.*    <-> blocks.N.attn_proj.* (the weight transposed)
//          transformer.h.N.mlp.c_fc.*       <-> blocks.N.mlp_fc.*    (the weight transposed)
//          transformer.h.N.mlp.c_proj.*     <-> blocks.N.mlp_proj.*  (the weight transposed)
//          transformer.{wpe,h.N.ln_1,h.N.ln_2,ln_f}.* <-> the same without "transformer." and with
//          "blocks" for "h"
//   Llama  model.X <-> X; lm_head.weight <-> lm_head.weight
// GPT-2 stores its linear layers as Conv1D, [in, out]: the transpose of
// torch::nn::Linear's [out, in]. Tensors a file may carry that are not
// weights are skipped: GPT-2's tied lm_head.weight and attention-mask
// buffers (attn.bias, attn.masked_bias), Llama's rotary_emb.inv_freq and a
// tied lm_head.weight.
#pragma once

#include <dtrain/checkpoint.h>
#include <dtrain/llama.h>
#include <dtrain/models.h>

#include <cstdint>
#include <string>

namespace dtrain::hf {

// An architecture as config.json describes it.
struct ModelConfig {
  // dtrain's --model: "gpt2" (GPT-2 with its tanh GELU), "gpt" (GPT-2's
  // layout with the exact GELU: activation_function "gelu") or "llama".
  std::string model;
  models::GPTConfig gpt;      // gpt, gpt2 (seq_len: n_positions)
  models::LlamaConfig llama;  // llama (seq_len: max_position_embeddings)
  std::string json;           // the file's text, kept to be written back on export
};

// Reads a config.json of model_type "gpt2" or "llama". Throws
// std::invalid_argument naming the file and the field for anything dtrain's
// models do not compute exactly as transformers does (rope_scaling, biases
// in Llama, GPT-2's n_inner other than 4 x n_embd, ...).
ModelConfig read_config(const std::string& path);
// The same from the file's text; `where` names it in errors.
ModelConfig parse_config(const std::string& text, const std::string& where);

// The config.json text transformers loads for a dtrain model: `base` (a
// config.json's text, or "" for none) with the architecture's fields set.
std::string config_json(const ModelConfig& config, const std::string& base = "");

// Whether `path` is a Hugging Face model directory (a folder with config.json).
bool is_model_directory(const std::string& path);

// The Hugging Face name of dtrain tensor `name` of a `model` ("gpt", "gpt2",
// "llama"), and whether it is stored transposed. Throws
// std::invalid_argument for a name that has none.
std::string hf_name(const std::string& model, const std::string& name, bool* transposed = nullptr);

// Loads the model directory `dir` into what this rank holds (a whole module,
// FSDP's shards, a mesh's slices: dtrain/checkpoint.h), reading only the
// tensors it holds pieces of, one at a time. Every name and shape is checked
// first; std::runtime_error names the directory and lists the tensors the
// model lacks or the files lack, or the first shape that differs (in
// Hugging Face's names and layout). float16/bfloat16 files load into fp32.
void load_into(const HeldModel& held, const std::string& model, const std::string& dir);
// The same checks against a module (deferred is fine: only shapes are read).
void check_fits(const torch::nn::Module& module, const std::string& model, const std::string& dir);

// Writes checkpoint `checkpoint_dir`'s parameters to `out_dir` as a Hugging
// Face model directory: config.json (`config_json`, the architecture the
// checkpoint was trained with) and model.safetensors, or shards of at most
// `max_shard_bytes` (model-00001-of-0000N.safetensors) with
// model.safetensors.index.json. One tensor is in memory at a time. Returns
// the number of files written besides config.json.
int export_checkpoint(const std::string& checkpoint_dir, const std::string& out_dir, const ModelConfig& config,
                      int64_t max_shard_bytes);

}  // namespace dtrain::hf
