#include "dtrain/shard_range.h"

#include <algorithm>
#include <string>

namespace dtrain {

ShardRange shard_range(int64_t total, int world, int rank) {
  if (world <= 0 || rank < 0 || rank >= world || total < 0)
    throw CommError("shard_range: invalid arguments (total=" + std::to_string(total) +
                    ", world=" + std::to_string(world) + ", rank=" + std::to_string(rank) + ")");
  const int64_t base = total / world;
  const int64_t extra = total % world;  // the first `extra` ranks hold one more
  const int64_t offset = rank * base + std::min<int64_t>(rank, extra);
  return {offset, base + (rank < extra ? 1 : 0)};
}

}  // namespace dtrain
