// The rules of FSDP's schedule, in one place: the engine follows them
// (fsdp_state.cpp, unit.cpp, flat_parameter.cpp) and `dtrain plan` replays
// a step with them (src/plan/simulate_step.cpp, Note [memory plan]), so a
// change to a rule is made once and the plan cannot drift from the engine.
// LibTorch-free.
#pragma once

#include "dtrain/fsdp_compression.h"
#include "dtrain/sharding.h"

#include <cstddef>
#include <cstdint>

namespace dtrain::fsdp_rules {

// A unit's flat buffer over a shard group of `group_size` ranks: its `numel`
// parameter elements padded up to a multiple of the group, so every rank's
// shard has the same length (one all-gather, one reduce-scatter); never
// empty, so every rank holds a shard.
struct FlatSizes {
  int64_t padded = 0;
  int64_t shard = 0;
};
constexpr FlatSizes flat_sizes(int64_t numel, int64_t group_size) {
  int64_t padded = (numel + group_size - 1) / group_size * group_size;
  if (padded == 0) padded = group_size;
  return {padded, padded / group_size};
}

// Whether a unit frees its gathered parameters after its forward (gathering
// them again for backward): Full and Hybrid do; ZeRO-1/2 keep them. The
// root is needed first in backward, so it is never freed there.
constexpr bool reshard_after_forward(Sharding sharding, bool is_root) {
  return !is_root && (sharding == Sharding::Full || sharding == Sharding::Hybrid);
}

// Whether a unit frees its gathered parameters once its gradients are
// reduced: all but OptimizerOnly (ZeRO-1), which keeps them across steps.
constexpr bool free_after_backward(Sharding sharding) { return sharding != Sharding::OptimizerOnly; }

// Whether another all-gather may be issued ahead of need (prefetch) while
// `in_flight` are outstanding.
constexpr bool may_prefetch(int in_flight, int max_inflight_all_gathers) {
  return in_flight < max_inflight_all_gathers;
}

// OptimizerOnly all-reduces a unit's full gradient in place and its .grad
// views that buffer until zero_grad; the others reduce-scatter into a shard
// and drop the full buffer once backward waits for the reduction.
constexpr bool reduces_in_place(Sharding sharding) { return sharding == Sharding::OptimizerOnly; }

// Whether backward must wait for the oldest reduction before starting
// another, with `outstanding` not yet waited for: at most
// max_inflight_reductions full-size buffers live at once. In-place
// reductions keep every buffer anyway, so waiting early would free nothing.
constexpr bool must_wait_for_reduction(Sharding sharding, size_t outstanding, int max_inflight_reductions) {
  return !reduces_in_place(sharding) && outstanding >= static_cast<size_t>(max_inflight_reductions);
}

// What a compressed collective puts on the wire for one rank's piece of
// `count` elements: a record (src/fsdp/compression.h lays it out). Plain
// records are the elements in their own dtype.
enum class WireFormat { Plain, BF16, Int8, FP8 };

constexpr WireFormat wire_format(ParamCompression mode) {
  switch (mode) {
    case ParamCompression::BF16: return WireFormat::BF16;
    case ParamCompression::Int8: return WireFormat::Int8;
    case ParamCompression::FP8: return WireFormat::FP8;
    default: return WireFormat::Plain;
  }
}
constexpr WireFormat wire_format(GradCompression mode) {
  switch (mode) {
    case GradCompression::BF16: return WireFormat::BF16;
    case GradCompression::Int8: return WireFormat::Int8;
    default: return WireFormat::Plain;
  }
}

// A one-rank group sends nothing, so it compresses nothing: its numbers
// stay those of the uncompressed run.
constexpr WireFormat effective_format(WireFormat format, int64_t group_size) {
  return group_size > 1 ? format : WireFormat::Plain;
}

constexpr int64_t scale_blocks(int64_t count, int64_t block_size) { return (count + block_size - 1) / block_size; }

// Int8 and FP8: one byte per element plus one fp32 scale per block
// (256-element blocks: 260 bytes per 1024 of fp32, 0.254x); BF16: two bytes.
constexpr int64_t record_bytes(WireFormat format, int64_t count, int64_t block_size, int64_t plain_element_bytes) {
  switch (format) {
    case WireFormat::Plain: return count * plain_element_bytes;
    case WireFormat::BF16: return count * 2;
    case WireFormat::Int8:
    case WireFormat::FP8: return count + 4 * scale_blocks(count, block_size);
  }
  return 0;
}

}  // namespace dtrain::fsdp_rules
