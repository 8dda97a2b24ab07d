// FSDP's float8 all-gather (FSDPOptions::float8_all_gather): a unit's
// weights that dtrain::linear multiplies in fp8 cross the wire as fp8.
// Note [float8 all-gather] in float8_gather.cpp.
#pragma once

#include "fsdp/flat_parameter.h"

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace dtrain::detail {

// Which entries of a unit's flat parameter travel as fp8 and how a rank's
// record is laid out: [shard_numel bytes: fp8 codes of this rank's part of
// the fp8 entries (zeros elsewhere)] [hp_per_rank values in the compute
// dtype: this rank's part of the other entries, in entry order, padded].
class Float8Gather {
 public:
  // fp8[i]: entry i travels as fp8. group_size: ranks the unit is sharded over.
  Float8Gather(const FlatParameter& flat, std::vector<char> fp8, int group_size, torch::ScalarType compute_dtype);

  int64_t record_bytes() const { return record_bytes_; }
  int64_t fp8_entry_count() const { return static_cast<int64_t>(fp8_entries_.size()); }

  // The amax of this rank's part of each fp8 entry, in the compute dtype's
  // rounding, as float32 [fp8_entry_count] (0 for an empty part).
  torch::Tensor local_amax(const FlatParameter& flat) const;
  // From the amax over every rank: each entry's scale (dtrain::float8_scale).
  void set_amax(const torch::Tensor& amax);

  // This rank's record (record_bytes() bytes) from its shard.
  void encode(const FlatParameter& flat, torch::Tensor& record) const;
  // Every rank's record ([group_size * record_bytes()] bytes) into `full`
  // (the unit's full buffer, compute dtype): the fp8 entries as their fp8
  // values times their inverse scales, the others as sent.
  // Registers each fp8 weight's codes for dtrain::linear (Note [gathered
  // float8 weights]) under its full view in `flat`; keep_codes holds them.
  void decode(const FlatParameter& flat, const torch::Tensor& records, torch::Tensor& full,
              torch::Tensor& keep_codes) const;

 private:
  std::vector<int64_t> fp8_entries_;
  std::vector<int64_t> other_entries_;
  int group_size_;
  torch::ScalarType compute_dtype_;
  int64_t hp_per_rank_ = 0;
  int64_t record_bytes_ = 0;
  torch::Tensor hp_flat_index_;    // where each sent value of the other entries goes in the full buffer
  torch::Tensor hp_source_index_;  // which of the [group_size, hp_per_rank] values it is
  torch::Tensor scales_;           // float32 [fp8 entries]
};

}  // namespace dtrain::detail
