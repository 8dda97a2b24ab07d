// The c10d backend: LibTorch's own process groups (Gloo for CPU tensors, NCCL
// for CUDA tensors) behind the Communicator, with torchrun's rendezvous
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT through a TCPStore).
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

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

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

class C10dBackend final : public Backend {
 public:
  C10dBackend(c10::intrusive_ptr<c10d::Store> base_store, std::string prefix, int rank, int size,
              std::chrono::milliseconds timeout)
      : base_store_(std::move(base_store)), prefix_(std::move(prefix)), rank_(rank), size_(size),
        timeout_(timeout) {
    gloo_ = make_gloo_group(c10::make_intrusive<c10d::PrefixStore>(prefix_ + "/gloo", base_store_), rank_, size_,
                            timeout_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "c10d"; }

  void all_reduce(torch::Tensor& tensor, BackendReduce op) override {
    std::vector<torch::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = c10d_op(op);
    wait_for(group_for(tensor).allreduce(tensors, options), "allreduce");
  }

  void all_gather(const torch::Tensor& shard, torch::Tensor& full) override {
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
    auto in = as_transport(input);
    auto out = as_transport(output);
    std::vector<int64_t> equal_splits;  // empty: equal chunks
    wait_for(all_to_all_single(group_for(input), out, in, equal_splits), "all_to_all_single");
  }

  void broadcast(torch::Tensor& tensor, int root) override {
    std::vector<torch::Tensor> tensors{as_transport(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    wait_for(group_for(tensor).broadcast(tensors, options), "broadcast");
  }

  void barrier() override { wait_for(gloo_->barrier(), "barrier"); }

  void send(const torch::Tensor& tensor, int dst, int tag) override {
    std::vector<torch::Tensor> tensors{as_transport(tensor)};
    wait_for(group_for(tensor).send(tensors, dst, tag), "send");
  }

  void recv(torch::Tensor& tensor, int src, int tag) override {
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
                                         static_cast<int>(members.size()), timeout_);
  }

  [[noreturn]] void abort_job(int exit_code) override {
    // The launcher (dtrain launch or torchrun) sees this rank die and stops
    // the others; their own watchdogs are the second line of defence.
    std::fflush(stderr);
    std::_Exit(exit_code);
  }

 private:
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
    return std::make_unique<C10dBackend>(store, prefix, *rank, *world, startup_timeout);
  } catch (const c10::Error& error) {
    throw CommError("c10d rendezvous at " + host + ":" + std::to_string(port) + " failed for rank " +
                    std::to_string(*rank) + " of " + std::to_string(*world) + ": " + error.what_without_backtrace() +
                    " (check MASTER_ADDR/MASTER_PORT and that every rank was started)");
  }
}

}  // namespace dtrain
