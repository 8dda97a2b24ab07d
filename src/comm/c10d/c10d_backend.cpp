// The c10d backend: LibTorch's own process groups (Gloo for CPU tensors; NCCL
// or Gloo for CUDA tensors, Note [the CUDA engine]) behind the Communicator,
// with torchrun's rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
// through a TCPStore).
//
// Where a process group lacks an operation dtrain emulates it here:
// all_gather / reduce_scatter with shards of unequal size (a full size not
// divisible by the world size) pad every shard to the largest one, so they
// move at most world_size extra elements; split() creates a new Gloo group
// over a prefixed key space of the same store after one small all_gather of
// (color, key).
#include "comm/backend.h"
#include "comm/c10d/process_groups.h"
#include "comm/env.h"

#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

namespace dtrain {
namespace {

c10d::ReduceOp c10d_op(BackendReduce op) {
  switch (op) {
    case BackendReduce::Sum: return c10d::ReduceOp::SUM;
    case BackendReduce::Max: return c10d::ReduceOp::MAX;
    case BackendReduce::Min: return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// LibTorch 2.15 names the flat collectives all_gather_single and
// reduce_scatter_single (the old _allgather_base / _reduce_scatter_base stay
// as deprecated aliases); LibTorch 2.11 (the GPU machine's) has only the old
// names. Call whichever the headers declare.
template <class Group>
c10::intrusive_ptr<c10d::Work> all_gather_single(Group& group, at::Tensor& out, at::Tensor& in) {
  if constexpr (requires { group.all_gather_single(out, in); }) {
    return group.all_gather_single(out, in);
  } else {
    return group._allgather_base(out, in);
  }
}

template <class Group>
c10::intrusive_ptr<c10d::Work> reduce_scatter_single(Group& group, at::Tensor& out, at::Tensor& in,
                                                     const c10d::ReduceScatterOptions& options) {
  if constexpr (requires { group.reduce_scatter_single(out, in, options); }) {
    return group.reduce_scatter_single(out, in, options);
  } else {
    return group._reduce_scatter_base(out, in, options);
  }
}

// LibTorch 2.15 renamed alltoall_base to all_to_all_single; 2.11 has only the old name.
template <class Group>
c10::intrusive_ptr<c10d::Work> all_to_all_single(Group& group, at::Tensor& out, at::Tensor& in,
                                                 std::vector<int64_t>& splits) {
  if constexpr (requires { group.all_to_all_single(out, in, splits, splits); }) {
    return group.all_to_all_single(out, in, splits, splits);
  } else {
    return group.alltoall_base(out, in, splits, splits);
  }
}

// Moving data only needs the element size; these dtypes every group supports.
torch::Tensor as_transport(const torch::Tensor& t) {
  switch (t.element_size()) {
    case 1: return t.view(torch::kByte);
    case 2: return t.view(torch::kHalf);
    case 4: return t.view(torch::kInt);
    case 8: return t.view(torch::kLong);
    default: throw CommError("c10d backend cannot move elements of " + std::to_string(t.element_size()) + " bytes");
  }
}

void wait_for(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  try {
    work->wait();
  } catch (const c10::Error& error) {
    throw CommError(std::string("c10d ") + what + " failed: " + error.what_without_backtrace());
  }
}

// Note [the CUDA engine]
// NCCL is the engine for CUDA tensors where it can run, but it refuses two
// ranks on one GPU; ranks sharing a GPU (tests of multi-rank CUDA code on a
// one-GPU machine) use Gloo instead. DTRAIN_CUDA_BACKEND chooses: nccl, gloo,
// or auto (the default): nccl when every rank of this machine can have a GPU
// of its own (LOCAL_WORLD_SIZE, or the world size where the launcher does not
// set it, <= the visible devices), else gloo. Every rank must use the same
// engine, or their first CUDA collectives would never meet: the world settles
// it with one small all-reduce at startup (gloo if any rank chose gloo), and
// split() hands it to the children.
enum class CudaEngine { Nccl, Gloo };

const char* to_string(CudaEngine engine) { return engine == CudaEngine::Nccl ? "nccl" : "gloo"; }

CudaEngine cuda_engine_wanted(int world_size) {
  const std::string choice = cuda_backend_from_environment();
  if (choice == "nccl") return CudaEngine::Nccl;
  if (choice == "gloo") return CudaEngine::Gloo;
  const int local_ranks = env_int("LOCAL_WORLD_SIZE", 1, 1 << 20).value_or(world_size);
  // (device_count() is size_t in some LibTorch versions, int8 in others.)
  const int devices = static_cast<int>(torch::cuda::device_count());
  return local_ranks <= devices ? CudaEngine::Nccl : CudaEngine::Gloo;
}

// Note [CUDA tensors over gloo]
// Gloo moves host memory, so a CUDA tensor on the gloo engine is staged
// through pinned host buffers (ProcessGroupGloo's own CUDA paths cover some
// operations only, send/recv not at all, and differ between LibTorch
// versions; one path for every operation is simpler to trust). Ordering
// follows the issuer's current stream, which the Communicator makes current
// on its thread (IssuerContext in communicator.cpp):
// - inputs: copied to the host on that stream, then the stream is
//   synchronised, so the host reads the values every kernel queued before
//   the collective produced;
// - outputs: copied back on that stream without waiting, so whatever the
//   issuer queues after wait() sees them, as with NCCL's results. The caching
//   host allocator records the copy on the stream, so the pinned buffer is
//   not reused before the copy has read it.

c10::Stream current_stream(const torch::Tensor& t) {
  return c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device());
}

// A pinned host buffer of t's shape and dtype; its contents are undefined.
torch::Tensor host_buffer_like(const torch::Tensor& t) {
  return torch::empty(t.sizes(), torch::TensorOptions(t.scalar_type()).pinned_memory(true));
}

// t's values on the host, once all work queued before on the current stream has run.
torch::Tensor to_host(const torch::Tensor& t) {
  auto host = host_buffer_like(t);
  host.copy_(t, /*non_blocking=*/true);
  current_stream(t).synchronize();
  return host;
}

// Queues the copy of `host` into the CUDA tensor t on the current stream.
void copy_back(torch::Tensor& t, const torch::Tensor& host) { t.copy_(host, /*non_blocking=*/true); }

class C10dBackend final : public Backend {
 public:
  C10dBackend(c10::intrusive_ptr<c10d::Store> base_store, std::string prefix, int rank, int size,
              std::chrono::milliseconds timeout, CudaEngine cuda_engine)
      : base_store_(std::move(base_store)), prefix_(std::move(prefix)), rank_(rank), size_(size),
        timeout_(timeout), cuda_engine_(cuda_engine) {
    gloo_ = make_gloo_group(c10::make_intrusive<c10d::PrefixStore>(prefix_ + "/gloo", base_store_), rank_, size_,
                            timeout_);
  }

  // Collective, once, on the world (Note [the CUDA engine]).
  void agree_on_cuda_engine() {
    auto nccl = torch::tensor({cuda_engine_ == CudaEngine::Nccl ? 1 : 0}, torch::kInt32);
    all_reduce(nccl, BackendReduce::Min);
    cuda_engine_ = nccl.item<int>() == 1 ? CudaEngine::Nccl : CudaEngine::Gloo;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // The engines in use, e.g. "c10d (gloo; cuda: nccl)".
  std::string name() const override { return std::string("c10d (gloo; cuda: ") + to_string(cuda_engine_) + ")"; }

  void all_reduce(torch::Tensor& tensor, BackendReduce op) override {
    if (staged(tensor)) {
      auto host = to_host(tensor);
      all_reduce(host, op);
      copy_back(tensor, host);
      return;
    }
    std::vector<torch::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d_op(op);
    wait_for(group_for(tensor).allreduce(tensors, options), "allreduce");
  }

  void all_gather(const torch::Tensor& shard, torch::Tensor& full) override {
    if (staged(full)) {
      auto host_full = host_buffer_like(full);
      all_gather(to_host(shard), host_full);
      copy_back(full, host_full);
      return;
    }
    auto& group = group_for(full);
    if (full.numel() % size_ == 0) {
      auto out = as_transport(full);
      auto in = as_transport(shard);
      wait_for(all_gather_single(group, out, in), "all_gather_single");
      return;
    }
    // Unequal shards: gather equal padded pieces, then drop the padding.
    const int64_t piece = shard_range(full.numel(), size_, 0).count;
    auto padded_in = torch::zeros({piece}, shard.options());
    padded_in.narrow(0, 0, shard.numel()).copy_(shard);
    auto padded_out = torch::empty({piece * size_}, full.options());
    auto out = as_transport(padded_out);
    auto in = as_transport(padded_in);
    wait_for(all_gather_single(group, out, in), "all_gather_single");
    for (int r = 0; r < size_; ++r) {
      const auto range = shard_range(full.numel(), size_, r);
      full.narrow(0, range.offset, range.count).copy_(padded_out.narrow(0, r * piece, range.count));
    }
  }

  void reduce_scatter(const torch::Tensor& full, torch::Tensor& shard, BackendReduce op) override {
    if (staged(full)) {
      auto host_shard = host_buffer_like(shard);
      reduce_scatter(to_host(full), host_shard, op);
      copy_back(shard, host_shard);
      return;
    }
    auto& group = group_for(full);
    c10d::ReduceScatterOptions options;
    options.reduceOp = c10d_op(op);
    if (full.numel() % size_ == 0) {
      auto in = full;
      wait_for(reduce_scatter_single(group, shard, in, options), "reduce_scatter_single");
      return;
    }
    const int64_t piece = shard_range(full.numel(), size_, 0).count;
    auto padded_in = torch::zeros({piece * size_}, full.options());
    for (int r = 0; r < size_; ++r) {
      const auto range = shard_range(full.numel(), size_, r);
      padded_in.narrow(0, r * piece, range.count).copy_(full.narrow(0, range.offset, range.count));
    }
    auto padded_out = torch::empty({piece}, shard.options());
    wait_for(reduce_scatter_single(group, padded_out, padded_in, options), "reduce_scatter_single");
    shard.copy_(padded_out.narrow(0, 0, shard.numel()));
  }

  void all_to_all(const torch::Tensor& input, torch::Tensor& output) override {
    if (staged(input)) {
      auto host_output = host_buffer_like(output);
      all_to_all(to_host(input), host_output);
      copy_back(output, host_output);
      return;
    }
    auto in = as_transport(input);
    auto out = as_transport(output);
    std::vector<int64_t> equal_splits;  // empty: equal chunks
    wait_for(all_to_all_single(group_for(input), out, in, equal_splits), "all_to_all_single");
  }

  void broadcast(torch::Tensor& tensor, int root) override {
    if (staged(tensor)) {
      // Only the root's values are read; the others' are overwritten.
      auto host = rank_ == root ? to_host(tensor) : host_buffer_like(tensor);
      broadcast(host, root);
      if (rank_ != root) copy_back(tensor, host);
      return;
    }
    std::vector<torch::Tensor> tensors{as_transport(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    wait_for(group_for(tensor).broadcast(tensors, options), "broadcast");
  }

  void barrier() override { wait_for(gloo_->barrier(), "barrier"); }

  void send(const torch::Tensor& tensor, int dst, int tag) override {
    if (staged(tensor)) return send(to_host(tensor), dst, tag);
    std::vector<torch::Tensor> tensors{as_transport(tensor)};
    wait_for(group_for(tensor).send(tensors, dst, tag), "send");
  }

  void recv(torch::Tensor& tensor, int src, int tag) override {
    if (staged(tensor)) {
      auto host = host_buffer_like(tensor);
      recv(host, src, tag);
      copy_back(tensor, host);
      return;
    }
    std::vector<torch::Tensor> tensors{as_transport(tensor)};
    wait_for(group_for(tensor).recv(tensors, src, tag), "recv");
  }

  std::unique_ptr<Backend> split(int color, int key) override {
    auto mine = torch::tensor({static_cast<int64_t>(color), static_cast<int64_t>(key)}, torch::kInt64);
    auto everyone = torch::empty({2 * size_}, torch::kInt64);
    all_gather(mine, everyone);
    const std::string child_prefix = prefix_ + "/split" + std::to_string(split_count_++);
    if (color < 0) return nullptr;
    // Members ordered by (key, parent rank), as MPI_Comm_split does.
    std::vector<std::pair<int64_t, int>> members;
    const auto* all = everyone.data_ptr<int64_t>();
    for (int r = 0; r < size_; ++r)
      if (all[2 * r] == color) members.emplace_back(all[2 * r + 1], r);
    std::sort(members.begin(), members.end());
    const int child_rank = static_cast<int>(
        std::find(members.begin(), members.end(), std::make_pair(static_cast<int64_t>(key), rank_)) -
        members.begin());
    return std::make_unique<C10dBackend>(base_store_, child_prefix + "/color" + std::to_string(color), child_rank,
                                         static_cast<int>(members.size()), timeout_, cuda_engine_);
  }

  [[noreturn]] void abort_job(int exit_code) override {
    // The launcher (dtrain launch or torchrun) sees this rank die and stops
    // the others; their own watchdogs are the second line of defence.
    std::fflush(stderr);
    std::_Exit(exit_code);
  }

 private:
  // A CUDA tensor that goes through host memory (Note [CUDA tensors over gloo]).
  bool staged(const torch::Tensor& t) const { return t.is_cuda() && cuda_engine_ == CudaEngine::Gloo; }

  c10d::Backend& group_for(const torch::Tensor& t) {
    if (!t.is_cuda()) return *gloo_;
    // Created on first use, at the same point of the op sequence on all ranks.
    if (!nccl_)
      nccl_ = make_nccl_group(c10::make_intrusive<c10d::PrefixStore>(prefix_ + "/nccl", base_store_), rank_, size_,
                              timeout_);
    return *nccl_;
  }

  c10::intrusive_ptr<c10d::Store> base_store_;
  std::string prefix_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  CudaEngine cuda_engine_;
  c10::intrusive_ptr<c10d::Backend> gloo_;
  c10::intrusive_ptr<c10d::Backend> nccl_;
  int split_count_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_c10d_world_backend(std::chrono::milliseconds timeout) {
  const auto world = env_int("WORLD_SIZE", 1, 1 << 20);
  const auto rank = world ? env_int("RANK", 0, *world - 1) : std::nullopt;
  if (!world || !rank) throw CommError("the c10d backend needs RANK and WORLD_SIZE (set by torchrun or dtrain launch)");
  const std::string host = env_string("MASTER_ADDR").value_or("127.0.0.1");
  const int port = env_int("MASTER_PORT", 1, 65535).value_or(29500);
  // Before the rendezvous: a bad value fails at once, not after the others connect.
  const CudaEngine cuda_engine = cuda_engine_wanted(*world);
  // Startup (loading LibTorch, reaching init on every rank, Gloo's full-mesh
  // connect) is not bounded by the per-operation timeout: a short
  // DTRAIN_TIMEOUT must not fail a slow start. Gloo's own operation timeout
  // is the same longer bound, so dtrain's watchdog reports first.
  const auto startup_timeout = std::max<std::chrono::milliseconds>(timeout, std::chrono::minutes(5));
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  // Under torchrun's agent store the agent already serves MASTER_PORT.
  options.isServer = *rank == 0 && env_string("TORCHELASTIC_USE_AGENT_STORE").value_or("") != "True";
  options.numWorkers = *world;
  options.waitWorkers = true;  // every rank checks in; rank 0 waits for all of them
  options.timeout = startup_timeout;
  // A torchrun restart reuses the agent's store: keep each attempt's keys apart.
  const std::string prefix = "dtrain/attempt" + env_string("TORCHELASTIC_RESTART_COUNT").value_or("0") + "/world";
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
    auto backend = std::make_unique<C10dBackend>(store, prefix, *rank, *world, startup_timeout, cuda_engine);
    backend->agree_on_cuda_engine();
    return backend;
  } catch (const c10::Error& error) {
    throw CommError("c10d rendezvous at " + host + ":" + std::to_string(port) + " failed for rank " +
                    std::to_string(*rank) + " of " + std::to_string(*world) + ": " + error.what_without_backtrace() +
                    " (check MASTER_ADDR/MASTER_PORT and that every rank was started)");
  }
}

}  // namespace dtrain
