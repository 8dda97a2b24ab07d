// Join: training with a different number of batches on each rank (uneven
// inputs), after PyTorch's torch.distributed.algorithms.Join and Horovod's
// hvd.join.
//
//   dtrain::Join join(world);
//   for (int64_t i = 0; join.next_step(i < my_batches.size()); ++i) {
//     const Batch& b = i < my_batches.size() ? my_batches[i] : any_batch;  // same shape
//     optimizer.zero_grad();
//     (loss_fn(model(b.x), b.y) * join.loss_scale()).backward();
//     optimizer.step();
//   }
//
// Every rank runs the loop for as many steps as the rank with the most
// batches. A rank whose batches ran out ("joined") keeps running the step on
// any batch of the right shape, with its loss multiplied by 0: it issues the
// same collectives in the same order as the ranks still training (DDP's bucket
// all-reduces and used-parameter map, FSDP's all-gathers and reduce-scatters,
// clip_grad_norm's all-reduce, whatever the engine issues), contributes zero
// gradients, receives the averaged gradient (DDP) or its shard of it (FSDP)
// and steps its optimizer with it, so its replica or shards stay those of the
// ranks still training. A rank with a batch scales its loss by
// world / active, so the engines' average over the world (sum / world) is the
// average over the ranks that had a batch (sum / active): the step equals
// single-process training on exactly the samples seen in that step. With
// every rank active the scale is exactly 1 and the step is bitwise the one
// without Join.
//
// Works with any engine and strategy because it changes none: it costs one
// all-reduce of one integer per step, and a joined rank computes a forward and
// backward it throws away (it would otherwise wait). Note [uneven inputs] in
// src/comm/join.cpp says why, and what the shadow step does not undo
// (SyncBatchNorm statistics, find_unused_parameters, buffers).
#pragma once

#include <dtrain/comm.h>

#include <cstdint>

namespace dtrain {

class Join {
 public:
  explicit Join(CommPtr comm);

  // Called by every rank at the start of every step, before its forward;
  // has_batch: this rank has a batch for this step. Agrees with the other
  // ranks (one all-reduce) on how many have one; returns false when none
  // has, and then the loop ends on every rank at the same step.
  bool next_step(bool has_batch);

  // Multiply this step's loss by it before backward: world / active ranks on
  // a rank with a batch (exactly 1 when all are active), 0 on a joined rank.
  double loss_scale() const;

  // Ranks with a batch in the current step, and whether this rank is one.
  int active_ranks() const { return active_; }
  bool has_batch() const { return has_batch_; }
  // Steps begun so far (next_step calls that returned true).
  int64_t steps() const { return steps_; }

 private:
  CommPtr comm_;
  int active_ = 0;
  bool has_batch_ = false;
  int64_t steps_ = 0;
};

}  // namespace dtrain
