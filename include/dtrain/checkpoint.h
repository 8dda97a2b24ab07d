// Checkpoints: files of weights and training state.
//
// ---------------------------------------------------------------- safetensors
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

// ------------------------------------------------------- sharded checkpoints
//
// A training checkpoint is a directory:
//
//   DIR/rank-00000-of-00004.safetensors   this rank's pieces of every parameter,
//   ...                                   buffer and optimizer state tensor
//   DIR/manifest.json                     written last, by rank 0
//
// Every tensor is cut along its flattened elements: a rank file holds, under
// the tensor's global name, the 1-D piece [begin, end) of the flattened
// tensor, and the manifest lists, per file, which piece of which tensor it
// holds, plus each tensor's dtype and global shape and each file's size and
// xxHash64. Optimizer state is stored under "optim/PARAM/KEY" (AdamW/Adam:
// exp_avg, exp_avg_sq, max_exp_avg_sq, step; SGD: momentum_buffer).
//
// Who writes what: FSDP ranks write the parameter pieces they own;
// replicated data (DDP, single process, buffers, Sharding::None and the
// replicas of Sharding::Hybrid) is split evenly across the ranks that hold a
// copy, so every rank writes about 1/world of it and no byte is written
// twice (write bandwidth scales with ranks; the loader is one code path).
//
// A checkpoint saved at world size N with any strategy loads at any world
// size M with any strategy: each rank reads, for each of its pieces, the
// saved pieces that overlap it. After loading, training continues exactly as
// if uninterrupted.
//
//   dtrain::save_checkpoint("ckpt/step-100", fsdp, &optimizer, 100);   // collective
//   auto info = dtrain::load_checkpoint("ckpt/step-100", fsdp, &optimizer);  // collective
//   // DDP or single process: pass the module and the world communicator:
//   dtrain::save_checkpoint(dir, *model, &optimizer, step, world);
//
// Saving is atomic: files go to DIR.tmp-STEP, are fsynced, then rank 0
// writes the manifest and renames the directory to DIR (an existing DIR is
// moved aside first and removed only once the new one is in place). A
// directory without a complete, parseable manifest is never loaded, and
// loading first checks every file's checksum: a mismatch is a
// CheckpointDamagedError naming the file, and nothing is changed.


#include <dtrain/checkpoint_manifest.h>
#include <dtrain/comm.h>

#include <memory>

namespace torch::optim {
class Optimizer;
}

namespace dtrain {

class FullyShardedBase;

// load_state_into for a sharded model: each rank reads from the safetensors
// file at `path` only the bytes of the parameter pieces it holds (and the
// buffers), straight into them, so no rank ever holds the whole file. Names,
// shapes and dtypes are checked first, as load_state_into does (the same
// std::runtime_error messages). Not collective: every rank calls it.
void load_safetensors_into(FullyShardedBase& fsdp, const std::string& path);
// Whether load_state_into would accept the file at `path` for `module`,
// reading only the file's header (the module may be deferred): throws what
// it would throw.
void check_safetensors_fits(const torch::nn::Module& module, const std::string& path);

// The full tensors of the checkpoint (parameters and buffers; with
// optimizer_state also "optim/..." entries), assembled from every rank file.
// Single process; checks checksums first.
std::map<std::string, torch::Tensor> load_full_checkpoint(const std::string& dir, bool optimizer_state = false);
// The full (unsharded) parameters and buffers of the checkpoint in `dir`
// written to one safetensors file at `path` (save_safetensors_streamed): one
// tensor is in memory at a time, assembled from the rank files' pieces.
// Checks checksums first. Returns the number of tensors written.
size_t export_checkpoint_safetensors(const std::string& dir, const std::string& path,
                                     const std::map<std::string, std::string>& metadata = {});

// Collective over `comm` (null: single process). `model` is the plain module
// (single process) or the module a DDP replica wraps (every rank equal).
// `optimizer` may be null (no optimizer state saved / loaded).
void save_checkpoint(const std::string& dir, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                     int64_t step, const CommPtr& comm = nullptr, const std::map<std::string, std::string>& extra = {});
// Collective over fsdp.comm(): each rank saves its shards.
void save_checkpoint(const std::string& dir, FullyShardedBase& fsdp, torch::optim::Optimizer* optimizer, int64_t step,
                     const std::map<std::string, std::string>& extra = {});

// Loads parameters, buffers and (when `optimizer` is given and the
// checkpoint has it) optimizer state; returns the manifest (step, extra).
// Throws std::runtime_error (on every rank) when the checkpoint is
// incomplete, corrupt, or does not match the model (names, global shapes)
// or the optimizer's type; the model is then unchanged.
CheckpointManifest load_checkpoint(const std::string& dir, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                                   const CommPtr& comm = nullptr);
CheckpointManifest load_checkpoint(const std::string& dir, FullyShardedBase& fsdp, torch::optim::Optimizer* optimizer);

}  // namespace dtrain
