// Join (include/dtrain/join.h): uneven inputs across ranks.
//
// Note [uneven inputs]
// A rank out of data must keep issuing the collectives the others issue, in
// the same order and with the same sizes, and the average must count only
// the ranks that had a batch.
// - Collectives: a joined rank runs the ordinary step (forward, backward,
//   optimizer) on any batch of the right shape with its loss scaled by 0.
//   Its autograd graph is the same as the active ranks' (for a model whose
//   control flow does not depend on the data), so DDP's hooks fill the same
//   buckets and FSDP gathers and reduces the same units in the same order,
//   whatever options, hooks, prefetching or strategy are in use, and any
//   per-step collective the user adds (clip_grad_norm) is matched too.
//   Engine-level shadow steps (PyTorch's DDP Join hook) would save that
//   compute, but each engine would need a second, hand-kept copy of its
//   schedule (FSDP's prefetch and reduction order, hybrid groups,
//   compression) that must match the real one byte for byte; a joined rank
//   only waits otherwise.
// - Zero contributions: the gradient of 0 * loss is 0 (or -0) everywhere,
//   and x + 0 = x, so the sums are those of the active ranks.
// - The divisor: the engines average over the world (Avg = sum / world, as
//   do the compression hooks and FSDP's compressed reduce-scatter). An active
//   rank scales its loss by world / active, so what arrives is
//   sum_active(world / active * g) / world = sum_active(g) / active: the
//   gradient of single-process training on the step's samples (equal local
//   batch sizes). Scaling the loss, not the reduced gradient, needs no hook
//   in any engine; with every rank active the scale is exactly 1.0, and
//   x * 1.0 = x, so the result is bitwise the one without Join.
// - The optimizer: the averaged gradient (DDP) or the rank's shard of it
//   (FSDP) arrives on the joined rank as on the others, so its optimizer
//   steps with it and its replica or shards stay consistent.
// - Not undone by the zero scale: a shadow forward still runs the model, so
//   SyncBatchNorm counts the joined rank's batch in its statistics, running
//   statistics (BatchNorm buffers) update on the joined rank (broadcast from
//   rank 0 under DDP's broadcast_buffers), and under find_unused_parameters
//   the parameters the shadow batch used count as used (zero, not absent,
//   gradient). A model whose collectives depend on the data must pick the
//   shadow batch so they match.
#include <dtrain/join.h>

#include <torch/torch.h>

#include <stdexcept>
#include <utility>

namespace dtrain {

Join::Join(CommPtr comm) : comm_(std::move(comm)) {
  if (!comm_) throw std::invalid_argument("dtrain::Join: null communicator");
}

bool Join::next_step(bool has_batch) {
  // int32 on the CPU: exact, and every backend reduces it.
  auto count = torch::full({1}, has_batch ? 1 : 0, torch::kInt32);
  comm_->all_reduce(count, ReduceOp::Sum)->wait();
  active_ = count.item<int32_t>();
  has_batch_ = has_batch;
  if (active_ == 0) return false;
  ++steps_;
  return true;
}

double Join::loss_scale() const {
  if (!has_batch_) return 0.0;
  const int world = comm_->size();
  if (active_ == world) return 1.0;  // exactly: the step stays bitwise unchanged
  return static_cast<double>(world) / active_;
}

}  // namespace dtrain
