// The order DDP's buckets are rebuilt in (DDPOptions::rebuild_buckets).
#pragma once

#include <dtrain/comm.h>

#include <cstdint>
#include <vector>

namespace dtrain::detail {

// The order gradients became ready in during the first synchronised backward
// (`arrived`, this rank's), completed by the parameters that got none (in
// reverse registration order), as rank 0 saw it: ranks may see different
// orders, and every rank must build the same buckets. One broadcast of one
// int32 per parameter (none for a single parameter); its bytes are added to
// `bytes_sent`.
std::vector<int> agreed_gradient_order(Communicator& comm, const std::vector<int>& arrived, size_t parameters,
                                       int64_t& bytes_sent);

}  // namespace dtrain::detail
