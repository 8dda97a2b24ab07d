// Used when LibTorch was built without CUDA: CUDA tensors cannot exist, but
// say so plainly if one is ever passed.
#include "comm/c10d/process_groups.h"

#include "dtrain/comm.h"

namespace dtrain {

c10::intrusive_ptr<c10d::Backend> make_nccl_group(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                                  std::chrono::milliseconds) {
  throw CommError("this dtrain build has no NCCL support: LibTorch was found without CUDA");
}

}  // namespace dtrain
