// A unit's parameters as one flat buffer, sharded over a group.
//
// The flat buffer concatenates the unit's parameters (in registration order)
// and pads the end to a multiple of the group size G, so every rank's shard
// has the same length S = padded / G: one all-gather and one reduce-scatter
// per unit, never uneven. Rank r owns flat elements [r*S, (r+1)*S).
//
// Two storages:
// - the shard (S elements, the parameters' own dtype: fp32 master weights):
//   outside forward/backward every parameter's data is the 1-D piece of the
//   shard that falls inside it (possibly empty), so an optimizer built on
//   model->parameters() holds state for this rank's elements only;
// - the full buffer (padded elements, the compute dtype): during forward and
//   backward every parameter's data is its full-shape view of it. Freeing
//   releases the storage's bytes but keeps the storage object, so tensors
//   that autograd saved in forward see the values again once the buffer is
//   refilled (docs/libtorch-notes.md, "set_data does not change what backward uses").
#pragma once

#include <torch/types.h>

#include <optional>

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::detail {

struct FlatEntry {
  std::string name;
  torch::Tensor param;           // the user's parameter (identity never changes)
  std::vector<int64_t> shape;
  int64_t offset = 0;            // in the flat buffer
  int64_t numel = 0;
  // The part of [offset, offset + numel) in this rank's shard:
  int64_t local_begin = 0;       // offset of that part within the parameter
  int64_t local_count = 0;
};

class FlatParameter {
 public:
  // The parameters' current values must be identical on every rank. A
  // deferred parameter (dtrain/deferred_init.h) keeps its place in the
  // layout, zeros in the shard and no storage until take_piece(i).
  // `device`: where the shard lives (unset: the parameters' device); each
  // piece is copied there as it is taken.
  FlatParameter(std::vector<std::string> names, std::vector<torch::Tensor> params, int group_size, int group_rank,
                torch::ScalarType compute_dtype, std::optional<torch::Device> device = std::nullopt);

  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_numel_; }
  int64_t shard_numel() const { return shard_numel_; }
  std::vector<FlatEntry>& entries() { return entries_; }
  const std::vector<FlatEntry>& entries() const { return entries_; }

  // This rank's shard, master dtype.
  const torch::Tensor& shard() const { return shard_; }
  // The piece of the shard inside parameter i (1-D, possibly empty).
  torch::Tensor shard_piece(const torch::Tensor& flat_shard, size_t i) const;
  // Where that piece starts within the shard.
  int64_t local_offset(size_t i) const;
  // Copies this rank's piece of parameter i (now at full size) into the
  // shard and points the parameter at it, freeing the full-size data.
  void take_piece(size_t i);
  // False while a deferred parameter still waits for take_piece().
  bool all_pieces_taken() const;

  bool full_allocated() const;
  void allocate_full();
  void free_full();
  // The full buffer as a tensor with its own version counter (not an
  // autograd view of the parameters' full views): communication writes
  // through it without invalidating tensors autograd saved.
  torch::Tensor full_for_writing() const;
  // True when the full buffer is the shard itself (a one-rank group in the
  // master dtype): nothing to gather, nothing to free.
  bool full_is_shard() const { return full_is_shard_; }

  // The full buffer's storage (its StorageImpl), which parameter i's full
  // view holds at offset entries()[i].offset, gathered or freed.
  const void* full_storage() const;

  void use_full_views();
  void use_shard_views();
  bool using_full_views() const { return using_full_views_; }

 private:
  std::vector<FlatEntry> entries_;
  int64_t numel_ = 0, padded_numel_ = 0, shard_numel_ = 0, shard_begin_ = 0;
  torch::ScalarType compute_dtype_;
  torch::Tensor shard_;
  torch::Tensor full_;  // its storage is emptied and refilled
  bool full_is_shard_ = false;
  bool using_full_views_ = false;
};

}  // namespace dtrain::detail
