#include "comm/debug_check.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace dtrain {

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::AllGather: return "all_gather";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Barrier: return "barrier";
    case OpKind::Split: return "split";
    case OpKind::AllToAll: return "all_to_all";
    case OpKind::AllReduceCoalesced: return "all_reduce_coalesced";
    case OpKind::AllGatherCoalesced: return "all_gather_coalesced";
  }
  return "?";
}

namespace {

std::string detail_text(OpKind kind, int64_t detail) {
  switch (kind) {
    case OpKind::AllReduce:
    case OpKind::AllReduceCoalesced:
    case OpKind::ReduceScatter: return std::string(", op=") + to_string(static_cast<ReduceOp>(detail));
    case OpKind::Broadcast: return ", root=" + std::to_string(detail);
    default: return "";
  }
}

constexpr int kFields = 5;

}  // namespace

std::string describe(const OpSignature& s, uint64_t number) {
  return std::string(to_string(s.kind)) + " #" + std::to_string(number) + " (count=" + std::to_string(s.count) +
         ", dtype=" + dtype_name(s.dtype) + detail_text(s.kind, s.detail) + ")";
}

void check_same_op_on_all_ranks(Backend& backend, const OpSignature& s, uint64_t collective_index) {
  const int world = backend.size();
  auto mine = torch::tensor({static_cast<int64_t>(s.kind), s.count, static_cast<int64_t>(s.dtype), s.detail,
                             static_cast<int64_t>(collective_index)},
                            torch::kInt64);
  auto everyone = torch::empty({world * kFields}, torch::kInt64);
  backend.all_gather(mine, everyone);
  const auto* all = everyone.data_ptr<int64_t>();
  const auto* own = mine.data_ptr<int64_t>();
  for (int peer = 0; peer < world; ++peer) {
    const int64_t* theirs = all + peer * kFields;
    if (std::equal(own, own + kFields, theirs)) continue;
    OpSignature other{static_cast<OpKind>(theirs[0]), theirs[1], static_cast<torch::ScalarType>(theirs[2]),
                      theirs[3]};
    throw CommError("DTRAIN_DEBUG: ranks issued different collectives (#N counts collectives only): rank " +
                    std::to_string(backend.rank()) + " issued " + describe(s, collective_index) + " but rank " +
                    std::to_string(peer) + " issued " +
                    describe(other, static_cast<uint64_t>(theirs[4])) +
                    ". Every rank must issue the same collectives, with the same sizes, in the same order.");
  }
}

bool debug_mode_from_environment() {
  const char* value = std::getenv("DTRAIN_DEBUG");
  return value != nullptr && *value != '\0' && std::string(value) != "0";
}

}  // namespace dtrain
