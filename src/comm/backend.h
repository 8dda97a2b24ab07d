// The interface a transport implements. Internal: engines use Communicator.
//
// Note [backend contract]: every method is blocking and is called only from
// the owning Communicator's background thread, one call at a time, in the same
// order on every rank. Arguments arrive validated (contiguous, matching sizes
// and dtypes; see communicator.cpp), and low-precision floats arrive already
// widened to fp32 for reductions, so a backend only moves bytes and reduces
// fp32/fp64/int32/int64/uint8. Avg never reaches a backend (it is Sum then a divide).
// A backend reports failure by throwing CommError.
#pragma once

#include "dtrain/comm.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>

namespace dtrain {

enum class BackendReduce { Sum, Max, Min };

class Backend {
 public:
  virtual ~Backend() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  // Why this backend cannot take `tensor` (e.g. a CUDA tensor on mpi), or
  // nullopt. Checked on the caller's thread, so the error comes at the call
  // and does not poison the communicator.
  virtual std::optional<std::string> why_unsupported(const torch::Tensor&) const { return std::nullopt; }

  virtual void all_reduce(torch::Tensor& tensor, BackendReduce op) = 0;
  // shard.numel() may differ between ranks (see shard_range); full is the
  // concatenation in rank order.
  virtual void all_gather(const torch::Tensor& shard, torch::Tensor& full) = 0;
  virtual void reduce_scatter(const torch::Tensor& full, torch::Tensor& shard, BackendReduce op) = 0;
  // input and output have the same numel, a multiple of size(): chunk i of
  // `input` goes to rank i, and chunk j of `output` comes from rank j. Moves
  // bytes only (any dtype; FSDP's compressed reduce-scatter sends uint8).
  virtual void all_to_all(const torch::Tensor& input, torch::Tensor& output) = 0;
  virtual void broadcast(torch::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;
  virtual void send(const torch::Tensor& tensor, int dst, int tag) = 0;
  virtual void recv(torch::Tensor& tensor, int src, int tag) = 0;
  // Collective; returns nullptr on ranks that pass color < 0.
  virtual std::unique_ptr<Backend> split(int color, int key) = 0;

  // The count of threads blocked in Work::wait() on this backend's
  // communicator (CommThread::waiters()), for backends that pace their
  // waits by it (Note [waiting without spinning]). Set once, before the
  // first operation.
  virtual void watch_waiters(const std::atomic<int>* /*waiters*/) {}

  // Called by the watchdog when an operation is stuck: terminate the whole job
  // (every rank), not only this process. Must not return.
  [[noreturn]] virtual void abort_job(int exit_code) = 0;
};

// Factories (each in its backend's directory).
std::unique_ptr<Backend> make_mpi_world_backend(int& argc, char**& argv);
std::unique_ptr<Backend> make_c10d_world_backend(std::chrono::milliseconds timeout);
std::unique_ptr<Backend> make_self_backend();

}  // namespace dtrain
