// What --checkpoint-async keeps in host memory: this rank's checkpoint file
// (src/checkpoint/save_protocol.h, rank_file_of), copied into the staging
// buffer with each tensor on a 64-byte boundary (Note [staging buffer] in
// src/checkpoint/staging_buffer.h). A rank writes what it holds (DDP: the
// whole replica; FSDP: its shard of each unit's flat buffer) split over the
// ranks that hold the same elements, and the optimizer state of those
// elements; AdamW's step counter once per parameter, by the rank that writes
// its first element.
#include "plan/plan_internal.h"

#include <dtrain/shard_range.h>

namespace dtrain::plan::detail {
namespace {

constexpr int64_t kAlignment = 64;  // as the staging buffer lays tensors out

int64_t aligned(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

int64_t checkpoint_staging_bytes(const ModelSpec& model, const Layout& layout, Optimizer optimizer) {
  const int replicas = layout.replicas;
  const int replica = layout.ddp ? layout.rank : (layout.rank / layout.group_size) % replicas;
  const int64_t step_bytes = optimizer == Optimizer::AdamW ? aligned(8) : 0;  // an int64 "step" per parameter
  int64_t bytes = 0;
  for (const auto& unit : model.units) {
    const FlatLayout flat = layout.ddp ? FlatLayout{} : flat_layout(unit, layout);
    const int64_t shard_begin = layout.ddp ? 0 : flat.shard * layout.group_rank;
    int64_t offset = 0;  // the parameter's first element in the unit's flat buffer
    for (size_t i = 0; i < unit.parameters.size(); ++i) {
      const int64_t numel = unit.parameters[i].numel;
      const int64_t held = layout.ddp ? numel : flat.local_counts[i];
      const auto share = shard_range(held, replicas, replica);
      if (share.count > 0) {
        bytes += aligned(share.count * layout.master_bytes) * (1 + layout.optimizer_states);
        // The step counter goes with the parameter's first element.
        const bool first = layout.ddp ? share.offset == 0
                                      : offset >= shard_begin && offset < shard_begin + flat.shard && share.offset == 0;
        if (first) bytes += step_bytes;
      }
      offset += numel;
    }
  }
  // Buffers are replicated: split over every rank.
  return bytes + aligned((model.buffer_bytes + layout.world_size - 1) / layout.world_size);
}

}  // namespace dtrain::plan::detail
