// Built only when LibTorch has CUDA (DTRAIN_WITH_CUDA); see nccl_group_stub.cpp.
#include "comm/c10d/process_groups.h"

#include "dtrain/comm.h"

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/cuda.h>

namespace dtrain {

c10::intrusive_ptr<c10d::Backend> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout) {
  if (!torch::cuda::is_available())
    throw CommError("a CUDA tensor reached the c10d backend, but no CUDA device is available on this machine");
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
}

}  // namespace dtrain
