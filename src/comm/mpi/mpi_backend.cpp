// The MPI backend: each Communicator wraps one MPI communicator, and every
// operation maps onto MPI's own collective (MPI_Allreduce, MPI_Allgather[v],
// MPI_Reduce_scatter[_block], MPI_Bcast), so OpenMPI's tuned algorithms do the
// work. Each communicator has its own thread, hence MPI_THREAD_MULTIPLE.
// Operations that may overlap compute are issued non-blocking and completed
// by a test loop that does not spin (Note [waiting without spinning]).
#include "comm/backend.h"
#include "comm/completion_wait.h"
#include "comm/debug_check.h"

#include <mpi.h>

#include <cctype>
#include <climits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dtrain {
namespace {

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw CommError(std::string(call) + " failed: " + std::string(text, static_cast<size_t>(length)));
}

// Initialises MPI once and finalises it when the last communicator is gone.
class MpiRuntime {
 public:
  MpiRuntime(int& argc, char**& argv) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
      throw CommError("MPI was already finalized in this process (by an earlier dtrain world that was destroyed, "
                      "or by the program): call dtrain::init once and keep the world alive");
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = 0;
    if (initialized) {
      MPI_Query_thread(&provided);
    } else {
      check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
      owns_ = true;
    }
    if (provided < MPI_THREAD_MULTIPLE) {
      if (owns_) MPI_Finalize();
      throw CommError("MPI does not provide MPI_THREAD_MULTIPLE, which dtrain needs (one communication thread "
                      "per communicator): use an OpenMPI built with thread support, and if the program calls "
                      "MPI_Init itself, make it MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)");
    }
  }
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_ && !finalized) MPI_Finalize();
  }

 private:
  bool owns_ = false;
};

int checked_count(int64_t count) {
  if (count > INT_MAX)
    throw CommError("a message of " + std::to_string(count) + " elements exceeds MPI's int count limit");
  return static_cast<int>(count);
}

// Reductions only see fp32/fp64/int32/int64/uint8 (see Note [backend contract]).
MPI_Datatype reduce_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return MPI_FLOAT;
    case torch::kDouble: return MPI_DOUBLE;
    case torch::kInt: return MPI_INT32_T;
    case torch::kLong: return MPI_INT64_T;
    case torch::kByte: return MPI_UINT8_T;
    default: throw CommError(std::string("mpi backend cannot reduce dtype ") + dtype_name(t));
  }
}

// Moving data only needs the element size.
MPI_Datatype transport_type(const torch::Tensor& t) {
  switch (t.element_size()) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    case 8: return MPI_UINT64_T;
    default: throw CommError("mpi backend cannot move elements of " + std::to_string(t.element_size()) + " bytes");
  }
}

MPI_Op mpi_op(BackendReduce op) {
  switch (op) {
    case BackendReduce::Sum: return MPI_SUM;
    case BackendReduce::Max: return MPI_MAX;
    case BackendReduce::Min: return MPI_MIN;
  }
  return MPI_SUM;
}


class MpiBackend final : public Backend {
 public:
  // Takes ownership of `comm` (a dup or a split, never MPI_COMM_WORLD itself).
  MpiBackend(std::shared_ptr<MpiRuntime> runtime, MPI_Comm comm, WaitSettings wait)
      : runtime_(std::move(runtime)), comm_(comm), wait_(wait) {
    // Errors come back as return codes (turned into CommError) rather than
    // aborting inside MPI with a less helpful message.
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiBackend() override {
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  void watch_waiters(const std::atomic<int>* waiters) override { waiters_ = waiters; }

  std::optional<std::string> why_unsupported(const torch::Tensor& t) const override {
    if (!t.is_cpu()) return "is a CUDA tensor; the mpi backend moves CPU tensors only (use --backend c10d, NCCL)";
    if (t.numel() > INT_MAX) return "has more than 2^31-1 elements, MPI's count limit (split it)";
    return std::nullopt;
  }

  void all_reduce(torch::Tensor& tensor, BackendReduce op) override {
    const int count = checked_count(tensor.numel());
    const MPI_Datatype type = reduce_type(tensor.scalar_type());
    run(start_nonblocking(tensor.nbytes()), "MPI_Allreduce",
        [&] { return MPI_Allreduce(MPI_IN_PLACE, tensor.data_ptr(), count, type, mpi_op(op), comm_); },
        [&](MPI_Request* request) {
          return MPI_Iallreduce(MPI_IN_PLACE, tensor.data_ptr(), count, type, mpi_op(op), comm_, request);
        });
  }

  void all_gather(const torch::Tensor& shard, torch::Tensor& full) override {
    const MPI_Datatype type = transport_type(full);
    const bool nonblocking = start_nonblocking(full.nbytes());
    const int count = checked_count(shard.numel());
    if (full.numel() % size_ == 0) {
      run(nonblocking, "MPI_Allgather",
          [&] { return MPI_Allgather(shard.data_ptr(), count, type, full.data_ptr(), count, type, comm_); },
          [&](MPI_Request* request) {
            return MPI_Iallgather(shard.data_ptr(), count, type, full.data_ptr(), count, type, comm_, request);
          });
      return;
    }
    std::vector<int> counts, offsets;
    uneven_layout(full.numel(), counts, offsets);
    run(nonblocking, "MPI_Allgatherv",
        [&] {
          return MPI_Allgatherv(shard.data_ptr(), count, type, full.data_ptr(), counts.data(), offsets.data(), type,
                                comm_);
        },
        [&](MPI_Request* request) {
          return MPI_Iallgatherv(shard.data_ptr(), count, type, full.data_ptr(), counts.data(), offsets.data(), type,
                                 comm_, request);
        });
  }

  void reduce_scatter(const torch::Tensor& full, torch::Tensor& shard, BackendReduce op) override {
    const MPI_Datatype type = reduce_type(full.scalar_type());
    const bool nonblocking = start_nonblocking(full.nbytes());
    if (full.numel() % size_ == 0) {
      const int count = checked_count(shard.numel());
      run(nonblocking, "MPI_Reduce_scatter_block",
          [&] { return MPI_Reduce_scatter_block(full.data_ptr(), shard.data_ptr(), count, type, mpi_op(op), comm_); },
          [&](MPI_Request* request) {
            return MPI_Ireduce_scatter_block(full.data_ptr(), shard.data_ptr(), count, type, mpi_op(op), comm_,
                                             request);
          });
      return;
    }
    std::vector<int> counts, offsets;
    uneven_layout(full.numel(), counts, offsets);
    run(nonblocking, "MPI_Reduce_scatter",
        [&] { return MPI_Reduce_scatter(full.data_ptr(), shard.data_ptr(), counts.data(), type, mpi_op(op), comm_); },
        [&](MPI_Request* request) {
          return MPI_Ireduce_scatter(full.data_ptr(), shard.data_ptr(), counts.data(), type, mpi_op(op), comm_,
                                     request);
        });
  }

  void all_to_all(const torch::Tensor& input, torch::Tensor& output) override {
    const MPI_Datatype type = transport_type(input);
    const int count = checked_count(input.numel() / size_);
    check_mpi(MPI_Alltoall(input.data_ptr(), count, type, output.data_ptr(), count, type, comm_), "MPI_Alltoall");
  }

  void broadcast(torch::Tensor& tensor, int root) override {
    const int count = checked_count(tensor.numel());
    const MPI_Datatype type = transport_type(tensor);
    run(start_nonblocking(tensor.nbytes()), "MPI_Bcast",
        [&] { return MPI_Bcast(tensor.data_ptr(), count, type, root, comm_); },
        [&](MPI_Request* request) { return MPI_Ibcast(tensor.data_ptr(), count, type, root, comm_, request); });
  }

  // A barrier moves no data: all its time is waiting for the peers, the wait
  // that should not spin.
  void barrier() override {
    run(paced(), "MPI_Barrier", [&] { return MPI_Barrier(comm_); },
        [&](MPI_Request* request) { return MPI_Ibarrier(comm_, request); });
  }

  // Point to point: a non-blocking send or receive matches a blocking one,
  // so these are non-blocking whenever the wait is paced (waiting for the
  // peer to post its side should not spin either).
  void send(const torch::Tensor& tensor, int dst, int tag) override {
    const int count = checked_count(tensor.numel());
    const MPI_Datatype type = transport_type(tensor);
    run(paced(), "MPI_Send", [&] { return MPI_Send(tensor.data_ptr(), count, type, dst, tag, comm_); },
        [&](MPI_Request* request) { return MPI_Isend(tensor.data_ptr(), count, type, dst, tag, comm_, request); });
  }

  void recv(torch::Tensor& tensor, int src, int tag) override {
    MPI_Status status;
    const int count = checked_count(tensor.numel());
    const MPI_Datatype type = transport_type(tensor);
    run(paced(), "MPI_Recv", [&] { return MPI_Recv(tensor.data_ptr(), count, type, src, tag, comm_, &status); },
        [&](MPI_Request* request) { return MPI_Irecv(tensor.data_ptr(), count, type, src, tag, comm_, request); },
        &status);
    int received = 0;
    MPI_Get_count(&status, type, &received);
    if (received != tensor.numel())
      throw CommError("recv: expected " + std::to_string(tensor.numel()) + " elements from rank " +
                      std::to_string(src) + " but got " + std::to_string(received));
  }

  std::unique_ptr<Backend> split(int color, int key) override {
    MPI_Comm child = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child), "MPI_Comm_split");
    if (child == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiBackend>(runtime_, child, wait_);
  }

  [[noreturn]] void abort_job(int exit_code) override {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort should not return
  }

 private:
  // Decides how an operation of `bytes` runs (the same on every rank: it
  // depends on the size alone) and, under Handshake, first waits for the
  // peers in a non-blocking barrier. True: issue it non-blocking.
  bool start_nonblocking(size_t bytes) {
    if (wait_.mode == WaitSettings::Mode::Spin || static_cast<int64_t>(bytes) < wait_.nonblocking_min_bytes)
      return false;
    if (wait_.mode == WaitSettings::Mode::Backoff) return true;
    MPI_Request request;
    check_mpi(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier (before a collective)");
    complete(request, "MPI_Ibarrier (before a collective)");
    return false;
  }

  // Barriers and point-to-point operations wait through the paced loop
  // unless the mode is Spin (their form need not match across ranks).
  bool paced() const { return wait_.mode != WaitSettings::Mode::Spin; }

  // Runs the operation as a blocking call (`blocking()` returns its MPI
  // code), or starts it non-blocking (`start(&request)`) and completes it
  // through the paced loop; errors name the MPI call ("MPI_Allreduce", or
  // "MPI_Iallreduce" for the non-blocking form).
  template <class Blocking, class Start>
  void run(bool nonblocking, const char* call, Blocking blocking, Start start, MPI_Status* status = MPI_STATUS_IGNORE) {
    if (!nonblocking) {
      check_mpi(blocking(), call);
      return;
    }
    // MPI's naming rule: "MPI_Allreduce" -> "MPI_Iallreduce", "MPI_Send" -> "MPI_Isend".
    const std::string nonblocking_call =
        std::string("MPI_I") + static_cast<char>(std::tolower(static_cast<unsigned char>(call[4]))) + (call + 5);
    MPI_Request request;
    check_mpi(start(&request), nonblocking_call.c_str());
    complete(request, nonblocking_call.c_str(), status);
  }

  // Tests `request` until it completes, pausing between tests as Note
  // [waiting without spinning] says. A stuck request is the watchdog's to end.
  void complete(MPI_Request& request, const char* call, MPI_Status* status = MPI_STATUS_IGNORE) {
    CompletionWait wait(wait_, waiters_);
    for (;;) {
      int done = 0;
      check_mpi(MPI_Test(&request, &done, status), call);
      if (done) return;
      wait.pause();
    }
  }

  void uneven_layout(int64_t total, std::vector<int>& counts, std::vector<int>& offsets) const {
    counts.resize(size_);
    offsets.resize(size_);
    for (int r = 0; r < size_; ++r) {
      const auto range = shard_range(total, size_, r);
      counts[r] = checked_count(range.count);
      offsets[r] = checked_count(range.offset);
    }
  }

  std::shared_ptr<MpiRuntime> runtime_;
  MPI_Comm comm_;
  WaitSettings wait_;
  const std::atomic<int>* waiters_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Backend> make_mpi_world_backend(int& argc, char**& argv) {
  auto runtime = std::make_shared<MpiRuntime>(argc, argv);
  // A private copy of MPI_COMM_WORLD: the program's own MPI calls (and their
  // error handler) never match or interfere with dtrain's.
  MPI_Comm world = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world), "MPI_Comm_dup");
  // All ranks on this host (shared memory) or not: every rank computes the
  // same answer, so every rank picks the same wait mode.
  MPI_Comm host = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host), "MPI_Comm_split_type");
  int host_size = 0, world_size = 0;
  MPI_Comm_size(host, &host_size);
  MPI_Comm_size(world, &world_size);
  MPI_Comm_free(&host);
  // Rank 0's settings hold everywhere: a rank whose environment differs
  // (another host, a launcher that does not pass the variables on) would
  // otherwise issue blocking collectives that its peers issue non-blocking,
  // which MPI never matches: a hang.
  const WaitSettings mine = WaitSettings::from_environment(host_size == world_size);
  int64_t shared[3] = {static_cast<int64_t>(mine.mode), mine.nonblocking_min_bytes, mine.max_sleep.count()};
  check_mpi(MPI_Bcast(shared, 3, MPI_INT64_T, 0, world), "MPI_Bcast (wait settings)");
  WaitSettings settings = mine;
  settings.mode = static_cast<WaitSettings::Mode>(shared[0]);
  settings.nonblocking_min_bytes = shared[1];
  settings.max_sleep = std::chrono::microseconds(shared[2]);
  return std::make_unique<MpiBackend>(std::move(runtime), world, settings);
}

}  // namespace dtrain
