// Sharded training checkpoints: one safetensors file per rank and a manifest,
// reloadable at any world size and strategy. (Whole-model safetensors files:
// dtrain/safetensors.h, included here.)
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
// swapped out in one atomic exchange and removed only once the new one is in
// place). A directory without a complete, parseable manifest is never
// loaded, and loading first validates everything (the manifest's fields and
// pieces, every file's size, checksum and header): a damaged file is a
// CheckpointDamagedError naming it, and nothing is changed. Every rank must
// see DIR on one shared filesystem.

#pragma once

#include <dtrain/checkpoint_manifest.h>
#include <dtrain/comm.h>
#include <dtrain/flat_runs.h>
#include <dtrain/safetensors.h>

#include <memory>

namespace torch::optim {
class Optimizer;
}

namespace dtrain {

class FullyShardedBase;
class DeviceMesh;

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
// The checkpoint's parameters and buffers (no optimizer state), for
// exporters: calls `use` once with their names, dtypes and shapes and a
// function that assembles entry i from the rank files (one whole tensor).
// Checks checksums first.
using CheckpointTensorsVisitor = std::function<void(const std::vector<SafetensorsEntry>& entries,
                                                    const std::function<torch::Tensor(size_t)>& tensor_at)>;
void read_checkpoint_tensors(const std::string& dir, const CheckpointTensorsVisitor& use);

// What one rank holds of a model and its optimizer, as pieces of flattened
// global tensors: the view sharded save and load work on, whatever the
// parallelism. The overloads below build it for a module (single process,
// DDP) and for FSDP; an engine that keeps its parameters its own way (the
// parameter server's servers: slices of the flat parameter vector) builds
// one itself.
struct HeldTensor {
  std::string name;            // the tensor's global name ("blocks.0.attn.weight")
  std::vector<int64_t> shape;  // its global shape
  int64_t begin = 0, end = 0;  // the elements [begin, end) of the flattened tensor this rank holds
  torch::Tensor flat;          // those elements, 1-D; a view (a load writes the model through it)
  int replicas = 1, replica = 0;  // `replicas` ranks hold the same elements; this one is copy `replica`
  torch::Tensor parameter;     // for parameters: the tensor the optimizer keys its state by (its numel = flat's)
  // When not empty, the elements of the flattened tensor `flat` holds, in
  // order, instead of [begin, end): a tensor-parallel slice (held_on_mesh).
  std::vector<FlatRun> runs;
};
struct HeldModel {
  std::string strategy;  // the manifest's strategy (a --strategy name)
  int rank = 0, world_size = 1;
  std::vector<HeldTensor> tensors;  // what this rank writes, or reads
  // The optimizer the manifest names when this rank has none of its own
  // (a parameter-server worker: the servers hold the optimizer); empty: the
  // kind of the optimizer passed.
  std::string optimizer_kind;
};

// A model spread over a mesh (dtrain/mesh.h) with dimension "dp" and any of
// "pp" and "tp": what this rank holds of the global, unsplit tensors, for
// save_checkpoint / load_checkpoint over mesh.world().
// - tp (dtrain/tensor_parallel.h): the parallel layers say where their
//   slices sit in the global weights (tp::parameter_places); replicated
//   parameters count as copies across the tp group.
// - pp (dtrain/pipeline.h): `module` is this rank's stage; `whole` (the whole
//   model, deferred costs no memory) gives the other stages' names, shapes
//   and dtypes, listed as empty pieces so that a checkpoint lists every
//   tensor and a load checks them all. A tensor several stages hold (GPT's
//   tied wte, on the first and the last) is a copy on each, written once.
// - cp (dtrain/context_parallel.h): the cp ranks hold the same parameters,
//   copies across dp x cp (mesh.comm("dp_cp"), DeviceMesh::flatten).
// `module`: the model (or stage) whole on each dp rank (DDP over dp, or
// dp = 1); `fsdp`: sharded over mesh.comm("dp"), or "dp_cp" with cp. A checkpoint saved on one
// mesh loads on any other, into any strategy, and into the plain
// single-process model; each element is written once.
//
//   dtrain::save_checkpoint(dir, dtrain::held_on_mesh(fsdp, mesh), &optimizer, step, mesh.world());
HeldModel held_on_mesh(torch::nn::Module& module, const DeviceMesh& mesh, const torch::nn::Module* whole = nullptr);
HeldModel held_on_mesh(FullyShardedBase& fsdp, const DeviceMesh& mesh, const torch::nn::Module* whole = nullptr);

// held_on_mesh(stage, mesh, &whole) on a (dp, pp) mesh.
HeldModel held_on_pipeline(torch::nn::Module& stage, const torch::nn::Module& whole, const DeviceMesh& mesh);

// load_safetensors_into for any view of what a rank holds (held_on_mesh:
// a tensor-parallel model reads its slices of a whole model's file).
void load_safetensors_into(const HeldModel& held, const std::string& path);

// Collective over `comm`: each rank writes the pieces `held` lists (a
// 1/replicas share of replicated ones) and their optimizer state. A rank may
// hold nothing.
void save_checkpoint(const std::string& dir, const HeldModel& held, torch::optim::Optimizer* optimizer, int64_t step,
                     const CommPtr& comm, const std::map<std::string, std::string>& extra = {});
// Collective over `comm`: each rank reads the pieces `held` lists. A rank
// that holds only part of the model lists the others as empty pieces
// (begin == end), so that the model's names are checked against the
// checkpoint's.
CheckpointManifest load_checkpoint(const std::string& dir, const HeldModel& held, torch::optim::Optimizer* optimizer,
                                   const CommPtr& comm);

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
