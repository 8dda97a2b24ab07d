// Gradient clipping of what DDP trains (the arithmetic is in src/comm/grad_norm.cpp).
#include <dtrain/ddp.h>

namespace dtrain {

double clip_grad_norm(DistributedDataParallelBase& ddp, double max_norm, double norm_type) {
  // After DDP's backward every rank holds the same averaged gradients.
  return clip_grad_norm(ddp.parameters(), max_norm, norm_type, nullptr);
}

}  // namespace dtrain
