// Note [staging buffer]: --checkpoint-async copies what a rank writes into
// host memory before training changes it, then writes the copy in the
// background. The copy lives in one byte buffer per rank that is reused from
// save to save: it is allocated once, at the first save (and again only if a
// later save needs more, e.g. once optimizer state exists), so a run pays
// for it once and the tracking allocator shows it as one steady block of the
// size of this rank's file (its shard of parameters, buffers and optimizer
// state; a 1/world share of a replicated model). With CUDA tensors the buffer
// is pinned host memory.
#pragma once

#include "checkpoint/save_protocol.h"

#include <torch/types.h>

#include <cstdint>

namespace dtrain::detail {

class StagingBuffer {
 public:
  // Copies each of `file`'s tensors into the buffer and points it at its
  // copy (same dtype and shape, contiguous).
  void stage(RankFile& file);
  // The buffer's size, and how many times it was (re)allocated.
  int64_t bytes() const { return buffer_.defined() ? buffer_.numel() : 0; }
  int64_t allocations() const { return allocations_; }

 private:
  torch::Tensor buffer_;  // uint8, host memory
  int64_t allocations_ = 0;
};

}  // namespace dtrain::detail
