// Making the replicas of a model identical across ranks: check that every
// rank built the same tensors, then copy rank 0's values everywhere.
#pragma once

#include <dtrain/comm.h>

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace dtrain::detail {

struct NamedTensor {
  std::string kind;  // "parameter" or "buffer": error messages say which
  std::string name;
  torch::Tensor tensor;
};

// Collective. Throws std::runtime_error on every rank when any rank's list
// differs from rank 0's in names, shapes or dtypes; the message names the
// first differing rank and its first difference. `who` starts the message
// ("DDP", "FSDP").
void check_same_on_all_ranks(Communicator& comm, const std::vector<NamedTensor>& tensors, const std::string& who);

// Collective, in place: every rank ends with rank 0's values. Tensors are
// packed into one buffer per dtype, so a model costs a few broadcasts, not
// one per tensor.
void broadcast_from_rank0(Communicator& comm, const std::vector<torch::Tensor>& tensors);

}  // namespace dtrain::detail
