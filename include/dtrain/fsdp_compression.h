// Compressed FSDP collectives (ZeRO++ style): what a unit's all-gather of
// parameters and reduce-scatter of gradients put on the wire. Apart from
// fsdp.h and LibTorch-free, so the strategy checks, `dtrain plan` and the
// byte arithmetic of the schedule rules can name it. docs/fsdp.md,
// "Compressed collectives", says what each mode sends and what it costs.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain {

// How the parameters travel in the all-gather. Every rank, the shard's owner
// included, computes with the values that arrived (dequantised into the
// compute dtype), so all ranks use identical weights; the fp32 master shards
// and the optimizer never see the compression.
enum class ParamCompression {
  None,  // the compute dtype (mixed_precision.param_dtype)
  BF16,  // bfloat16
  Int8,  // int8, symmetric per block: scale = absmax / 127, one fp32 scale per block (qwZ)
  FP8,   // float8 e4m3, per block: scale = absmax / 448, one fp32 scale per block
};

// How the gradients travel in the reduce-scatter. Compressed modes quantise
// each destination rank's chunk, exchange the chunks with one all-to-all and
// sum what arrives in fp32 on the receiver (qgZ), then divide by the group
// size as the plain reduce-scatter does.
enum class GradCompression {
  None,  // the reduce dtype, through Communicator::reduce_scatter
  BF16,  // bfloat16 chunks, summed in fp32
  Int8,  // int8 chunks with one fp32 scale per block, summed in fp32
};

struct CollectiveCompression {
  ParamCompression params = ParamCompression::None;
  GradCompression grads = GradCompression::None;
  // Elements per scale for Int8 and FP8 (blocks of the shard being sent;
  // the last block of a shard may be shorter).
  int64_t block_size = 256;

  bool operator==(const CollectiveCompression&) const = default;
};

const char* to_string(ParamCompression mode);  // "none" | "bf16" | "int8" | "fp8"
const char* to_string(GradCompression mode);   // "none" | "bf16" | "int8"

// `dtrain train --fsdp-compress`: "none", or comma-separated key=value pairs
// from params=none|bf16|int8|fp8, grads=none|bf16|int8, block=N (N >= 1),
// e.g. "params=int8,grads=bf16". Throws std::invalid_argument naming
// --fsdp-compress and what it accepts.
CollectiveCompression parse_collective_compression(const std::string& text);
// The inverse: "params=int8,grads=bf16,block=256", or "none".
std::string to_string(const CollectiveCompression& compression);

}  // namespace dtrain
