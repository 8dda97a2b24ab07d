// Hugging Face model directories in and out: checkpoints that `transformers`
// writes with save_pretrained load into a model, and dtrain's checkpoints
// export to directories that `transformers` loads unchanged. Nothing here
// knows a model: a model's spec says how its tensors are named and laid out
// (hf::Layout) and what its config.json holds (ModelSpec::hugging_face,
// dtrain/model_spec.h; the built-in GPT-2, GPT and Llama adapters are in
// src/train/builtin_hugging_face.cpp).
//
// A model directory holds config.json and either model.safetensors or
// model.safetensors.index.json (whose "weight_map" names the shard file of
// each tensor). Tensors a file may carry that are not weights (a tied head,
// attention-mask buffers, rotary tables: Layout::skipped) are left out.
#pragma once

#include <dtrain/checkpoint.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace dtrain::hf {

// How a model's tensors are named and stored in a Hugging Face directory.
struct Layout {
  // The Hugging Face name of dtrain tensor `name`, and whether it is stored
  // transposed (GPT-2's Conv1D keeps [in, out], the transpose of
  // torch::nn::Linear's [out, in]). Throws std::invalid_argument for a
  // tensor that has no Hugging Face name.
  std::function<std::string(const std::string& name, bool* transposed)> name;
  // A tensor of the file that is not one of the model's and is no error
  // when left unread (GPT-2's tied lm_head.weight, attention-mask buffers);
  // unset: none.
  std::function<bool(const std::string& hf_name)> skipped;
  // A prefix every name has that some files leave out (GPT-2:
  // "transformer.", which GPT2Model's files lack); "" for none.
  std::string optional_prefix;
};

// A config.json: its fields read with checks whose errors name the file and
// the field (std::invalid_argument).
class Config {
 public:
  static Config read(const std::string& path);
  // `where` names the text in errors.
  static Config parse(const std::string& text, const std::string& where);

  const std::string& text() const { return text_; }
  const std::string& where() const { return where_; }
  std::string model_type() const { return string("model_type", ""); }

  bool has(const std::string& key) const;
  int64_t integer(const std::string& key) const;  // a positive integer; missing: an error
  int64_t integer(const std::string& key, int64_t otherwise) const;
  double number(const std::string& key, double otherwise) const;
  bool boolean(const std::string& key, bool otherwise) const;
  std::string string(const std::string& key, const std::string& otherwise) const;
  // A nested object (e.g. rope_scaling); an error when the field is not one.
  Config object(const std::string& key) const;
  // A field the model does not compute otherwise: refused, saying `why`,
  // unless it is absent or has the one value the model supports.
  void require(const std::string& key, bool supported, const std::string& why) const;
  void require(const std::string& key, const std::string& supported, const std::string& why) const;
  void require(const std::string& key, const char* supported, const std::string& why) const {
    require(key, std::string(supported), why);
  }
  [[noreturn]] void fail(const std::string& what) const;

 private:
  struct Fields;
  Config(std::shared_ptr<const Fields> fields, std::string text, std::string where);
  void require_value(const std::string& key, const Fields& supported, const std::string& why) const;
  std::shared_ptr<const Fields> fields_;
  std::string text_;
  std::string where_;
};

// Whether `path` is a Hugging Face model directory (a folder with config.json).
bool is_model_directory(const std::string& path);

// Loads the model directory `dir` into what this rank holds (a whole module,
// FSDP's shards, a mesh's slices: dtrain/checkpoint.h), reading only the
// tensors it holds pieces of, one at a time. Every name and shape is checked
// first; std::runtime_error names the directory and lists the tensors the
// model lacks or the files lack, or the first shape that differs (in
// Hugging Face's names and layout). float16/bfloat16 files load into fp32.
void load_into(const HeldModel& held, const Layout& layout, const std::string& dir);
// The same checks against a module (deferred is fine: only shapes are read).
void check_fits(const torch::nn::Module& module, const Layout& layout, const std::string& dir);

// Writes checkpoint `checkpoint_dir`'s parameters to `out_dir` as a Hugging
// Face model directory: `config_json` as config.json and model.safetensors,
// or shards of at most `max_shard_bytes` (model-00001-of-0000N.safetensors)
// with model.safetensors.index.json. One tensor is in memory at a time.
// Returns the number of files written besides config.json.
int export_checkpoint(const std::string& checkpoint_dir, const std::string& out_dir, const Layout& layout,
                      const std::string& config_json, int64_t max_shard_bytes);

}  // namespace dtrain::hf
