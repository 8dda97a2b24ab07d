// Debug mode (DTRAIN_DEBUG=1): before each collective, ranks exchange what
// they are about to issue and fail with an error naming both sides when they
// differ, instead of hanging or silently mixing up buffers.
#pragma once

#include "comm/backend.h"

#include <cstdint>
#include <string>

#include <torch/types.h>

namespace dtrain {

enum class OpKind : int64_t {
  AllReduce, AllGather, ReduceScatter, Broadcast, Barrier, Split, AllToAll, AllReduceCoalesced, AllGatherCoalesced
};
const char* to_string(OpKind kind);

struct OpSignature {
  OpKind kind;
  int64_t count;  // elements (the full size for all_gather / reduce_scatter)
  torch::ScalarType dtype;
  int64_t detail;  // reduce op, broadcast root, or 0
};

// "all_reduce #12 (count=1000, dtype=float32, op=sum)".
std::string describe(const OpSignature& signature, uint64_t number);

// Collective over `backend`; throws CommError when any rank's signature (or
// collective index) differs from this rank's. `collective_index` counts the
// collectives this communicator ran before this one; point-to-point
// operations are not counted, since ranks legitimately issue different ones.
void check_same_op_on_all_ranks(Backend& backend, const OpSignature& signature, uint64_t collective_index);

bool debug_mode_from_environment();

}  // namespace dtrain
