// safetensors files: whole-model weights, the format sharded checkpoints'
// rank files use too (dtrain/checkpoint.h).
//
// Hugging Face's safetensors format (https://huggingface.co/docs/safetensors):
// named tensors and a string-to-string metadata map, with no code in the
// file, readable by Python's `safetensors.torch.load_file` and most other
// frameworks. dtrain uses it for whole-model weights (`dtrain train
// --init-from FILE.safetensors`).
//
//   dtrain::save_module_safetensors(*model, "model.safetensors");
//   auto file = dtrain::load_safetensors("model.safetensors");
//   dtrain::load_state_into(*other_model, file);   // names, shapes and dtypes checked first
//
// The reader checks the whole header before it allocates anything: a
// malformed or hostile file is an error naming the file and the problem,
// never a read outside the file or an allocation larger than the file.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dtrain {

// The contents of a safetensors file.
struct SafetensorsFile {
  std::string path;  // where it was read from, for messages
  // In the order the file's header lists them. CPU, contiguous, each owning
  // its memory (nothing refers to the file after loading).
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::map<std::string, std::string> metadata;  // the header's "__metadata__"

  std::vector<std::string> names() const;
  // nullptr when the file has no tensor `name`.
  const torch::Tensor* find(const std::string& name) const;
  // Throws std::out_of_range naming the file when it has no tensor `name`.
  const torch::Tensor& at(const std::string& name) const;
};

// Writes `tensors` (in this order; any device, any layout: they are copied
// to CPU and made contiguous one at a time) and `metadata` to `path`
// atomically: the bytes go to `path`.tmp, which is flushed to disk (fsync)
// and renamed over `path`. On any failure the temporary file is removed and
// an existing `path` is left as it was; the std::runtime_error names the path
// and the operating system's reason. Dtypes: float32, bfloat16, float16,
// float64, float8 (e4m3fn, e5m2), int8-int64, uint8-uint64 and bool; names
// must be unique and not "__metadata__".
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// save_safetensors with each tensor produced only when it is written:
// tensor_at(i) must return a tensor of entries[i]'s dtype and shape, and only
// one is alive at a time (exporting a model larger than memory).
struct SafetensorsEntry {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
};
void save_safetensors_streamed(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                               const std::function<torch::Tensor(size_t)>& tensor_at,
                               const std::map<std::string, std::string>& metadata = {});

// Reads a whole safetensors file. Throws std::runtime_error "PATH: problem"
// for a file that cannot be read or does not follow the format: a header
// length beyond the file or above 100 MB, a header that is not a JSON object,
// an unknown dtype, a negative dimension, a shape whose byte count overflows,
// offsets that are not integers, run backwards or past the data, a byte
// count that disagrees with shape and dtype, tensors that overlap or leave
// holes in the data, a name given twice, a BOOL byte other than 0 or 1.
SafetensorsFile load_safetensors(const std::string& path);

// Saves a module's parameters and buffers (named_parameters() then
// named_buffers(), recursively, with their dotted names) to `path`, as
// save_safetensors() does.
void save_module_safetensors(const torch::nn::Module& module, const std::string& path,
                             const std::map<std::string, std::string>& metadata = {});

// Copies `file`'s tensors into `module`'s parameters and buffers, matched by
// their dotted names. Every name, shape and dtype is checked before anything
// is copied, so on error the module is unchanged: std::runtime_error naming
// the file and the names the module lacks, the names the file lacks, or the
// first shape or dtype that differs. Dtypes must match, except that a
// floating-point tensor may be widened (float16 or bfloat16 into float32 or
// float64, float32 into float64): that is exact, while narrowing would change
// the weights silently. Values land on each tensor's own device.
void load_state_into(torch::nn::Module& module, const SafetensorsFile& file);

}  // namespace dtrain
