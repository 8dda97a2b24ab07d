// Records of compressed FSDP collectives (include/dtrain/fsdp_compression.h):
// one rank's piece of a flat buffer, encoded as the bytes that cross the
// link, and decoded back on the receiver.
//
// A record of `count` elements (fsdp_rules::record_bytes gives its size):
// - BF16: the elements as bfloat16;
// - Int8, FP8: the fp32 scales of its blocks (block_size elements each, the
//   last one possibly shorter), then one byte per element: the element
//   divided by its block's scale, rounded to int8 (scale = absmax / 127) or
//   cast to float8 e4m3 (scale = absmax / 448). Symmetric, so zero stays
//   exactly zero; a block of zeros has scale 0.
// Records are uint8 tensors (on the values' device), so the Communicator
// moves them as bytes.
#pragma once

#include "fsdp/schedule_rules.h"

#include <torch/types.h>

#include <cstdint>

namespace dtrain::detail {

// Encodes `values` (1-D, floating) into `record` (uint8, exactly
// fsdp_rules::record_bytes(format, values.numel(), block_size, ...) bytes).
void encode_record(fsdp_rules::WireFormat format, int64_t block_size, const torch::Tensor& values,
                   torch::Tensor record);

// The `count` values a record holds, as fp32.
torch::Tensor decode_record(fsdp_rules::WireFormat format, int64_t block_size, const torch::Tensor& record,
                            int64_t count);

// Throws std::invalid_argument when this LibTorch cannot cast to float8
// e4m3 on CPU (FP8 parameters need it).
void check_fp8_supported();

}  // namespace dtrain::detail
