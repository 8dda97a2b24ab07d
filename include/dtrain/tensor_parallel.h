// Tensor parallelism (Megatron-style): one layer's weight split across the
// ranks of a tensor-parallel group (DeviceMesh's "tp" communicator), with the
// collectives placed so that forward and backward equal the unsplit layer.
//
// The two building blocks, each the other's transpose:
//   copy_to_group      forward: identity       backward: all-reduce (sum)
//   reduce_from_group  forward: all-reduce     backward: identity
// A ColumnParallelLinear (weight split by output features) reads a replicated
// input through copy_to_group: every rank computes its slice of the output,
// and in backward the input's gradient is the sum of every slice's part. A
// RowParallelLinear (split by input features) takes that split output and
// sums the partial products with reduce_from_group. A block of column then
// row (attention's qkv and projection, the MLP's fc and proj) thus costs one
// all-reduce forward and one backward, and its activations in between are
// split across the group.
//
// Every rank of the group computes the same loss from replicated values and
// runs backward on its own copy; so a replicated parameter (a LayerNorm's)
// gets the full gradient on every rank, and a split one its slice's.
//
// Initialisation does not depend on the group's size: each layer draws its
// full weight as the unsplit torch::nn module would from the default
// generator (so seed every rank of the group alike) and keeps its slice.
#pragma once

#include <dtrain/comm.h>
#include <dtrain/flat_runs.h>

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain::tp {

// ---------------------------------------------------------------- collectives
// Autograd-aware; `group` is the tensor-parallel communicator. A group of one
// rank makes every function the identity.

// Forward: x. Backward: the gradient all-reduced (sum) over the group.
torch::Tensor copy_to_group(const torch::Tensor& x, const CommPtr& group);
// Forward: x all-reduced (sum) over the group. Backward: the gradient as is.
torch::Tensor reduce_from_group(const torch::Tensor& x, const CommPtr& group);
// Forward: the ranks' x concatenated along the last dimension, in rank order
// (each rank's x has the same shape). Backward: this rank's slice of the
// gradient.
torch::Tensor gather_last_dim(const torch::Tensor& x, const CommPtr& group);
// Forward: this rank's slice of x along the last dimension (its size must
// divide evenly). Backward: the slices' gradients gathered.
torch::Tensor split_last_dim(const torch::Tensor& x, const CommPtr& group);

// Sequence parallelism: activations outside the tensor-parallel regions
// (LayerNorms, dropout, the residual stream) split along the sequence
// (dimension 1 of [B, T, C]; T must split evenly) instead of replicated.
// Forward: the ranks' sequence slices gathered into [B, T, C]. Backward: the
// ranks' gradients summed, this rank's slice of the sum (replaces
// copy_to_group at the entry of a column-parallel layer).
torch::Tensor gather_sequence(const torch::Tensor& x, const CommPtr& group);
// Forward: the ranks' partial [B, T, C] summed, this rank's sequence slice.
// Backward: the slices' gradients gathered (replaces reduce_from_group at the
// exit of a row-parallel layer).
torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, const CommPtr& group);
// Forward: this rank's sequence slice of a replicated x. Backward: gathered.
torch::Tensor split_sequence(const torch::Tensor& x, const CommPtr& group);
// Forward: the ranks' sequence slices gathered into [B, T, C], as
// gather_sequence. Backward: this rank's slice of the gradient, which every
// rank holds whole and alike because what follows runs replicated on the
// group (a pipeline stage's output, sent on by every tp rank and split again
// by the next stage); split_sequence's inverse.
torch::Tensor gather_sequence_replicated(const torch::Tensor& x, const CommPtr& group);

// ---------------------------------------------------------------- slicing
// Which rows of a full [out, in] weight a column-parallel rank holds: `out`
// is `sections` equal sections (a fused qkv has 3: q, k, v), and each section
// is split evenly across the group, so that rank r holds the r-th slice of
// every section (for attention: the same heads of q, k and v), sections in
// order. Throws std::invalid_argument when a section does not split evenly.
torch::Tensor column_slice(const torch::Tensor& full, int rank, int size, int64_t sections = 1);
// The columns (dim 1) of a full [out, in] weight a row-parallel rank holds.
torch::Tensor row_slice(const torch::Tensor& full, int rank, int size);

// ---------------------------------------------------------------- layers
struct ColumnParallelLinearOptions {
  bool bias = true;
  // Gather the split output into the full [..., out] on every rank (a final
  // layer); false: each rank returns its slice [..., out / size].
  bool gather_output = false;
  // Equal sections of the output features, each split across the group (see
  // column_slice): 3 for a fused qkv projection.
  int64_t sections = 1;
};

// y = x W^T + b with W's rows split across the group: weight [out / size, in],
// bias [out / size]. Input [..., in], replicated on the group's ranks.
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(int64_t in_features, int64_t out_features, CommPtr group,
                           ColumnParallelLinearOptions options = {});
  torch::Tensor forward(const torch::Tensor& x);
  // forward() for an input that went through gather_sequence, whose backward
  // already sums the ranks' input gradients (no copy_to_group).
  torch::Tensor forward_gathered(const torch::Tensor& x);
  // Sets this rank's slice from a full weight [out, in] and bias [out]
  // (undefined: keep zeros), e.g. from an unsplit model or a checkpoint.
  void load_full(const torch::Tensor& weight, const torch::Tensor& bias = {});
  int64_t in_features() const { return in_features_; }    // of the full layer
  int64_t out_features() const { return out_features_; }
  int64_t sections() const { return options_.sections; }
  const CommPtr& group() const { return group_; }

  torch::Tensor weight, bias;

 private:
  int64_t in_features_, out_features_;
  CommPtr group_;
  ColumnParallelLinearOptions options_;
};
TORCH_MODULE(ColumnParallelLinear);

struct RowParallelLinearOptions {
  bool bias = true;
  // The input is already split along its last dimension (a column-parallel
  // layer's output); false: x is replicated and each rank takes its slice.
  bool input_is_parallel = true;
};

// y = x W^T + b with W's columns split across the group: weight
// [out, in / size], bias [out] (replicated, added once after the sum).
// Output [..., out], replicated on the group's ranks.
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(int64_t in_features, int64_t out_features, CommPtr group,
                        RowParallelLinearOptions options = {});
  torch::Tensor forward(const torch::Tensor& x);
  // Sequence parallelism: reduce_scatter_sequence of the partial products,
  // then the bias (through copy_to_group: each rank adds it to its slice
  // only, so its gradient is summed over the group).
  torch::Tensor forward_sequence_parallel(const torch::Tensor& x);
  void load_full(const torch::Tensor& weight, const torch::Tensor& bias = {});
  int64_t in_features() const { return in_features_; }    // of the full layer
  int64_t out_features() const { return out_features_; }
  const CommPtr& group() const { return group_; }

  torch::Tensor weight, bias;

 private:
  int64_t in_features_, out_features_;
  CommPtr group_;
  RowParallelLinearOptions options_;
};
TORCH_MODULE(RowParallelLinear);

// An embedding whose rows (the vocabulary) are split across the group: rank r
// holds tokens [r * V / size, (r + 1) * V / size), looks up the tokens it
// holds (zeros for the others), and the group sums. weight [V / size, dim];
// initialised N(0, 1) as torch::nn::Embedding. Output replicated.
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(int64_t vocab_size, int64_t dim, CommPtr group);
  torch::Tensor forward(const torch::Tensor& tokens);
  // This rank's rows' part of the lookup, before the sum over the group.
  torch::Tensor partial(const torch::Tensor& tokens);
  void load_full(const torch::Tensor& weight);
  int64_t first_token() const { return first_; }  // of this rank's rows
  const CommPtr& group() const { return group_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t dim() const { return dim_; }

  torch::Tensor weight;

 private:
  int64_t vocab_size_, dim_, first_;
  CommPtr group_;
};
TORCH_MODULE(VocabParallelEmbedding);

// Cross-entropy over logits whose vocabulary is split across the group
// (rank r holds columns [r * V / size, (r + 1) * V / size) of [N, V]) without
// any rank forming the full logits: the row maxima, the sums of exponentials
// and the target logits are all-reduced ([N] each). Returns the per-row loss
// [N] (replicated), log(sum exp(z)) - z[target], equal to
// torch::nn::functional::cross_entropy with reduction none on the full logits;
// gradients flow to each rank's logits slice.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits_slice, const torch::Tensor& targets,
                                           const CommPtr& group);

// ---------------------------------------------------------------- whole models
// The qualified names of `root`'s parameters that are tensor-parallel slices
// (the parallel layers' weights, the column layers' biases); the others are
// replicated across the group.
std::vector<std::string> split_parameter_names(const torch::nn::Module& root);
// Where each of those slices sits in the unsplit layer's tensor of the same
// name: its global shape and the runs of global elements it holds, in order
// (column: rows of each section; row: columns, one run per row; vocabulary:
// rows). From the layers' sizes alone, so also for a deferred or sharded
// model. Sharded checkpoints save and load through it (dtrain::held_on_mesh).
std::map<std::string, PlaceInGlobal> parameter_places(const torch::nn::Module& root);

// Clips gradients by their global 2-norm over a model split across
// `group` (tensor parallelism) and, optionally, sharded across
// `shards_across` (FSDP over the data-parallel dimension; nullptr: the
// gradients are whole on every data-parallel rank). `split[i]` says whether
// parameters[i] is a slice (its part of the norm summed over the group) or
// replicated (counted once). Returns the norm before clipping; every rank
// scales its gradients by min(1, max_norm / (norm + 1e-6)), as
// torch::nn::utils::clip_grad_norm_ does on one process.
double clip_grad_norm(const std::vector<torch::Tensor>& parameters, const std::vector<bool>& split, double max_norm,
                      Communicator* shards_across, Communicator& group);

}  // namespace dtrain::tp
