// How a flat buffer splits over ranks (dtrain::shard_range), and CommError,
// which it throws: apart from comm.h so that code below the Communicator (the
// data sampler) can split without seeing it. comm.h includes this header.
#pragma once

#include <cstdint>
#include <stdexcept>

namespace dtrain {

// Thrown from Work::wait() (and from synchronous calls such as split()) when a
// communication failed: a backend error, a watchdog timeout, a mismatch found
// by debug mode, or invalid arguments.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Which elements of a flat buffer of `total` elements rank `rank` of `world`
// owns. Shards are as even as possible: the first total % world ranks hold one
// element more. all_gather and reduce_scatter use this split whenever the full
// size is not a multiple of the world size. Throws CommError for arguments
// that name no rank of a world.
struct ShardRange {
  int64_t offset = 0;
  int64_t count = 0;
};
ShardRange shard_range(int64_t total, int world, int rank);

}  // namespace dtrain
