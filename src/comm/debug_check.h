// Debug mode (DTRAIN_DEBUG=1): before each collective, ranks exchange what
// they are about to issue and fail with an error naming both sides when they
// differ, instead of hanging or silently mixing up buffers.
#pragma once

#include "comm/backend.h"

#include <cstdint>
#include <string>

namespace dtrain {

enum class OpKind : int64_t { AllReduce, AllGather, ReduceScatter, Broadcast, Barrier, Split };
const char* to_string(OpKind kind);

struct OpSignature {
  OpKind kind;
  int64_t count;  // elements (the full size for all_gather / reduce_scatter)
  torch::ScalarType dtype;
  int64_t detail;  // reduce op, broadcast root, or 0
};

std::string describe(const OpSignature& signature, uint64_t seq);

// Collective over `backend`; throws CommError when any rank's signature (or
// sequence number) differs from this rank's.
void check_same_op_on_all_ranks(Backend& backend, const OpSignature& signature, uint64_t seq);

bool debug_mode_from_environment();

}  // namespace dtrain
