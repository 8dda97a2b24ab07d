// The Communicator: the only way dtrain's engines talk to other ranks.
//
// Engines (DDP, FSDP, parameter server) call these operations and never a
// backend library directly. Every operation is asynchronous: it is queued on
// the communicator's single background thread, runs in issue order (so every
// rank sees the same sequence of collectives), and returns a Work handle;
// blocking() offers the collectives to callers that wait for them at once.
//
// Backends: "mpi" (OpenMPI, launched by mpirun) and "c10d" (LibTorch's c10d
// ProcessGroup: Gloo for CPU tensors, NCCL for CUDA tensors, or Gloo where
// ranks share a GPU (DTRAIN_CUDA_BACKEND, docs/communicator.md), rendezvous
// through TCPStore from the torchrun variables RANK / WORLD_SIZE /
// MASTER_ADDR / MASTER_PORT).
#pragma once

#include <dtrain/shard_range.h>

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace c10 {
struct Event;
}

namespace dtrain {

enum class ReduceOp { Sum, Avg, Max, Min };

// Point-to-point tags must lie in 0..kMaxTag (the bound every MPI guarantees).
constexpr int kMaxTag = 32767;
const char* to_string(ReduceOp op);
// "float32", "bfloat16", "int64", ...: the names error messages use.
std::string dtype_name(torch::ScalarType dtype);

// Handle to one queued operation.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation finished; rethrows its error (CommError).
  virtual void wait() = 0;
  virtual bool is_completed() const = 0;
  // An operation on CUDA tensors: an event on its issuer's stream, recorded
  // right after that stream was made to wait for the results, so a stream
  // that blocks on it waits for this operation only, not for work queued
  // behind it (Note [communication streams] in src/comm/comm_stream.h).
  // Recorded once wait() has returned; null for host tensors.
  virtual std::shared_ptr<const c10::Event> completion_event() const { return nullptr; }
};
using WorkPtr = std::shared_ptr<Work>;

class Backend;  // internal (src/comm/backend.h)

class Communicator {
 public:
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  // "mpi", "self" (the one-rank world of an unlaunched program), or "c10d"
  // followed by its engines: "c10d (gloo; cuda: nccl)" or "c10d (gloo; cuda: gloo)".
  std::string backend_name() const;

  // In place: every rank ends with the reduction of all ranks' `tensor`.
  // bf16/fp16 are reduced in fp32 and rounded once at the end, so the result
  // is the correctly rounded sum, not N-1 roundings. Avg needs a floating
  // dtype.
  WorkPtr all_reduce(torch::Tensor tensor, ReduceOp op = ReduceOp::Sum);
  // Flat all-gather: shard (this rank's piece) -> full (concatenation of every
  // rank's piece in rank order). shard.numel() must equal
  // shard_range(full.numel(), size(), rank()).count.
  WorkPtr all_gather(torch::Tensor shard, torch::Tensor full);
  // Flat reduce-scatter: full (every rank's contribution) -> shard (this
  // rank's piece of the reduction, as split by shard_range). Sum or Avg.
  WorkPtr reduce_scatter(torch::Tensor full, torch::Tensor shard, ReduceOp op = ReduceOp::Sum);
  // Personalised exchange: input and output have the same dtype, device and
  // numel, a multiple of size(); chunk i of `input` goes to rank i and chunk
  // j of `output` comes from rank j (equal chunks). Moves bytes, reduces
  // nothing, so a narrow dtype crosses the link as it is (FSDP's compressed
  // reduce-scatter is built on it; docs/fsdp.md).
  WorkPtr all_to_all(torch::Tensor input, torch::Tensor output);
  // Coalescing: several small collectives of one kind issued as one
  // operation over one flat buffer (one MPI call, one synchronisation of the
  // ranks) instead of one each, for engines that issue them back to back.
  // Results equal the separate calls' (docs/communicator.md, "Coalescing").
  // all_reduce_coalesced: in place, every tensor of the same dtype and device.
  WorkPtr all_reduce_coalesced(std::vector<torch::Tensor> tensors, ReduceOp op = ReduceOp::Sum);
  // all_gather_coalesced: all_gather(shards[i], fulls[i]) for every i, where
  // each full splits evenly (fulls[i].numel() == size() * shards[i].numel());
  // the pairs may differ in dtype (they travel as bytes).
  WorkPtr all_gather_coalesced(std::vector<torch::Tensor> shards, std::vector<torch::Tensor> fulls);
  // In place: every rank ends with root's `tensor`.
  WorkPtr broadcast(torch::Tensor tensor, int root);
  WorkPtr barrier();
  // Point-to-point. Sends and receives between one pair of ranks match in
  // issue order (per tag). Both are blocking operations on the
  // communicator's thread: a send may not finish until the peer receives it
  // (always on c10d; on mpi above MPI's eager limit), and later operations
  // wait behind it. So in a ring, let even ranks send first and odd ranks
  // receive first (or use two communicators from split()).
  WorkPtr send(torch::Tensor tensor, int dst, int tag = 0);
  WorkPtr recv(torch::Tensor tensor, int src, int tag = 0);

  // The collectives above for a caller that waits for each at once (a loss
  // all-reduce before .item(), a barrier): each returns when the operation
  // has finished, and throws CommError as Work::wait() does. When nothing is
  // queued or running, the operation runs on the calling thread without
  // waking the communicator's thread, which saves a thread hand-off per
  // operation (docs/communicator.md, "Operations waited for at once");
  // otherwise it queues behind the others, in issue order as always.
  class Blocking {
   public:
    void all_reduce(torch::Tensor tensor, ReduceOp op = ReduceOp::Sum);
    void all_gather(torch::Tensor shard, torch::Tensor full);
    void reduce_scatter(torch::Tensor full, torch::Tensor shard, ReduceOp op = ReduceOp::Sum);
    void all_to_all(torch::Tensor input, torch::Tensor output);
    void broadcast(torch::Tensor tensor, int root);
    void barrier();

   private:
    friend class Communicator;
    explicit Blocking(Communicator& comm) : comm_(comm) {}
    Communicator& comm_;
  };
  Blocking blocking() { return Blocking(*this); }

  // Collective over this communicator: ranks with the same color form a new
  // communicator, ordered by (key, rank). Blocks until the group exists.
  // color < 0 means "no group": returns nullptr for that rank.
  std::shared_ptr<Communicator> split(int color, int key);

  // Operation timeout used by the watchdog (default 300 s, env DTRAIN_TIMEOUT).
  std::chrono::milliseconds timeout() const;

  // Internal: communicators are made by init() and split().
  struct Impl;
  explicit Communicator(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};
using CommPtr = std::shared_ptr<Communicator>;

// Options for init(). Unset fields come from the environment.
struct InitOptions {
  // "mpi", "c10d", "self" or "" (auto: see backend_from_environment()).
  std::string backend;
};

// The backend a launcher asked for: "mpi" when OpenMPI/PMI variables are set
// (mpirun, srun, dtrain launch), "c10d" when RANK and WORLD_SIZE are set
// (torchrun, dtrain launch --backend c10d), else "self" (one process, no
// launcher). Throws CommError when only one of RANK / WORLD_SIZE is set.
std::string backend_from_environment();

// Creates the world communicator. Reads and removes `--backend mpi|c10d`
// (also `--backend=...`) from argv, so programs can pass their own flags
// through. Call once per process.
CommPtr init(int& argc, char** argv);
CommPtr init(const InitOptions& options = {});

}  // namespace dtrain
