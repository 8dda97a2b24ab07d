// Communication hooks: how a bucket of gradients is averaged across ranks.
//
// DDP hands each bucket to its hook the moment the bucket's last gradient is
// accumulated; the hook starts the reduction and returns a PendingReduction.
// At the end of backward DDP waits for every pending reduction, after which
// the bucket holds the (possibly approximate) global average. Hooks are
// chosen per model (DDPOptions::comm_hook); one hook object serves one model,
// since compressing hooks keep per-bucket state (error feedback, warm starts).
// Buckets may change members once, after the first synchronised step
// (DDPOptions::rebuild_buckets): state kept by bucket index must check
// GradBucket::names (PowerSGD and top-k start that bucket afresh).
#pragma once

#include <dtrain/comm.h>

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtrain {

// One bucket of gradients: a flat buffer and, for each parameter in it, a
// view of the buffer with that parameter's shape.
struct GradBucket {
  int index = 0;
  torch::Tensor buffer;
  std::vector<torch::Tensor> gradients;
  std::vector<std::string> names;
};

// A reduction in flight. wait() finishes it: afterwards bucket.buffer holds
// the global average. It may issue more collectives (PowerSGD's second round).
class PendingReduction {
 public:
  virtual ~PendingReduction() = default;
  virtual void wait() = 0;
};

// What a hook sees besides its bucket.
struct HookContext {
  Communicator& comm;
  // Synchronised backward passes completed before this one (0 for the first).
  int64_t iteration = 0;
  // The hook adds the payload bytes this rank hands to collectives, so
  // compression ratios are visible (DistributedDataParallelBase::last_step()).
  int64_t bytes_sent = 0;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  // Starts averaging `bucket` over ctx.comm. Every rank calls this for the
  // same buckets in the same order; the hook must issue the same collectives
  // on every rank.
  virtual std::unique_ptr<PendingReduction> reduce(GradBucket& bucket, HookContext& ctx) = 0;
};
using CommHookPtr = std::shared_ptr<CommHook>;

namespace hooks {

// Plain all-reduce (average) of the bucket: exact. The default.
CommHookPtr allreduce();

// What allreduce() does to one bucket: starts the average and counts its
// bytes; for hooks that leave some buckets or iterations uncompressed.
std::unique_ptr<PendingReduction> average(GradBucket& bucket, HookContext& ctx);

// Casts to bf16 / fp16 after dividing by the world size, sums in that format
// (dtrain reduces 16-bit floats in fp32 and rounds once), casts back. Half
// the bytes; error about one 16-bit rounding of each averaged value.
CommHookPtr bf16_compress();
CommHookPtr fp16_compress();

struct PowerSGDOptions {
  // Rank of the approximation P Q^T of each gradient matrix.
  int rank = 2;
  // Plain all-reduce for the first start_iteration steps, when gradients
  // change fastest and compression hurts most.
  int64_t start_iteration = 0;
  // Add last step's compression error back before compressing (needed for
  // convergence).
  bool error_feedback = true;
  // Start the power iteration from last step's Q instead of a fresh random
  // matrix.
  bool warm_start = true;
  // A tensor is compressed only when (n + m) * rank * min_compression_rate
  // <= n * m elements; the others (biases, small matrices) are all-reduced
  // uncompressed, together, in one collective per bucket.
  double min_compression_rate = 2.0;
  // Seed of the initial random Q, identical on every rank.
  uint64_t seed = 0;
};
// Low-rank compression (Vogels et al., 2019): one power-iteration step per
// training step. The first all-reduce (P) overlaps backward; orthogonalising
// P and the second all-reduce (Q) run when DDP waits for the bucket.
CommHookPtr powersgd(PowerSGDOptions options = {});

struct TopKOptions {
  // Fraction of each bucket's elements a rank sends (at least one).
  double ratio = 0.01;
  bool error_feedback = true;
};
// Top-k sparsification: each rank sends its k largest-magnitude entries
// (after adding its error memory) as int32 index and value pairs through an
// all-gather; every rank sums them into a dense average.
CommHookPtr topk(TopKOptions options = {});

// By name: "none"/"allreduce", "bf16", "fp16", "powersgd", "topk" (defaults);
// throws std::invalid_argument naming the allowed values.
CommHookPtr by_name(const std::string& name);

}  // namespace hooks
}  // namespace dtrain
