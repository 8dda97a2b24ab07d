// Communicator: argument checks on the caller's thread, then each operation is
// queued on the communicator's thread (see comm_thread.h). See
// Note [backend contract] in backend.h for what reaches a backend.
#include "comm/communicator_impl.h"
#include "comm/debug_check.h"

#include <cstdio>
#include <iostream>

namespace dtrain {

Communicator::Impl::Impl(std::unique_ptr<Backend> backend_in, std::chrono::milliseconds timeout_in, bool debug_in)
    : backend(std::move(backend_in)), timeout(timeout_in), debug(debug_in),
      thread(std::make_unique<CommThread>()) {
  Backend* raw = backend.get();
  watchdog = std::make_unique<Watchdog>(*thread, timeout, [raw](const std::string& what) {
    std::cerr << "dtrain: rank " << raw->rank() << " of " << raw->size() << " (" << raw->name()
              << " communicator): watchdog: " << what
              << ". A peer rank probably died, is stuck, or issued a different collective"
                 " (run with DTRAIN_DEBUG=1 to check). Aborting the job."
              << std::endl;
    raw->abort_job(1);
  });
}

CommPtr make_communicator(std::unique_ptr<Backend> backend, std::chrono::milliseconds timeout, bool debug) {
  return std::make_shared<Communicator>(std::make_unique<Communicator::Impl>(std::move(backend), timeout, debug));
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Communicator::~Communicator() {
  // Drain the queue while the watchdog still watches: an operation stuck at
  // exit (a peer that never joins) must end the job, not hang it.
  impl_->thread->shutdown();
  impl_->watchdog.reset();
  impl_->thread.reset();
}

int Communicator::rank() const { return impl_->backend->rank(); }
int Communicator::size() const { return impl_->backend->size(); }
std::string Communicator::backend_name() const { return impl_->backend->name(); }
std::chrono::milliseconds Communicator::timeout() const { return impl_->timeout; }

namespace {

bool is_low_precision(torch::ScalarType t) { return t == torch::kBFloat16 || t == torch::kHalf; }

void check_tensor(const torch::Tensor& t, const char* what, const char* op) {
  auto fail = [&](const std::string& why) { throw CommError(std::string(op) + ": " + what + " " + why); };
  if (!t.defined()) fail("is an undefined tensor");
  if (!t.is_contiguous()) fail("must be contiguous (call .contiguous() first)");
  if (!(t.is_cpu() || t.is_cuda())) fail("must be a CPU or CUDA tensor, got device " + t.device().str());
  switch (t.scalar_type()) {
    case torch::kFloat: case torch::kDouble: case torch::kBFloat16: case torch::kHalf:
    case torch::kInt: case torch::kLong: case torch::kByte: case torch::kBool:
      return;
    default:
      fail("has unsupported dtype " + dtype_name(t.scalar_type()) +
           " (supported: float32, float64, bfloat16, float16, int32, int64, uint8, bool)");
  }
}

void check_rank(int peer, int world, const char* what, const char* op) {
  if (peer < 0 || peer >= world)
    throw CommError(std::string(op) + ": " + what + " " + std::to_string(peer) + " is not a rank of this " +
                    std::to_string(world) + "-rank communicator");
}

// Runs on whichever thread executes the operation; executions are serialised
// (Note [issue order]), so the plain counter needs no lock.
void check_if_debugging(Communicator::Impl& impl, const OpSignature& sig) {
  if (impl.debug) check_same_op_on_all_ranks(*impl.backend, sig, impl.collectives_run);
  ++impl.collectives_run;
}

BackendReduce to_backend(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return BackendReduce::Max;
    case ReduceOp::Min: return BackendReduce::Min;
    default: return BackendReduce::Sum;  // Avg = Sum, then divide
  }
}

void check_reduce_op(ReduceOp op, torch::ScalarType dtype, const char* name) {
  if (op == ReduceOp::Avg && !c10::isFloatingType(dtype))
    throw CommError(std::string(name) + ": avg needs a floating-point tensor, got " + dtype_name(dtype) +
                    " (use sum and divide yourself for integers)");
  if (dtype == torch::kBool)
    throw CommError(std::string(name) + ": bool tensors cannot be reduced (use uint8 or int32)");
}

// Reductions of bf16/fp16 run in fp32 (see comm.h); Avg divides after the sum.
// `reduce` performs the backend reduction on a tensor of the working dtype.
template <typename Reduce>
void reduce_in_working_precision(const torch::Tensor& input, torch::Tensor& output, ReduceOp op, int world,
                                 Reduce reduce) {
  torch::Tensor in = is_low_precision(input.scalar_type()) ? input.to(torch::kFloat) : input;
  torch::Tensor out = is_low_precision(output.scalar_type()) ? torch::empty_like(output, torch::kFloat) : output;
  reduce(in, out);
  if (op == ReduceOp::Avg) out.div_(world);
  if (!out.is_same(output)) output.copy_(out);
}

}  // namespace

WorkPtr Communicator::all_reduce(torch::Tensor tensor, ReduceOp op) {
  check_tensor(tensor, "tensor", "all_reduce");
  check_reduce_op(op, tensor.scalar_type(), "all_reduce");
  const OpSignature sig{OpKind::AllReduce, tensor.numel(), tensor.scalar_type(), static_cast<int64_t>(op)};
  Impl* impl = impl_.get();
  return impl->thread->enqueue([sig](uint64_t seq) { return describe(sig, seq); },
                               [impl, sig, tensor, op](uint64_t) mutable {
                                 check_if_debugging(*impl, sig);
                                 reduce_in_working_precision(
                                     tensor, tensor, op, impl->backend->size(),
                                     [&](torch::Tensor& in, torch::Tensor& out) {
                                       if (!in.is_same(out)) out.copy_(in);
                                       impl->backend->all_reduce(out, to_backend(op));
                                     });
                               });
}

WorkPtr Communicator::all_gather(torch::Tensor shard, torch::Tensor full) {
  check_tensor(shard, "shard", "all_gather");
  check_tensor(full, "full", "all_gather");
  if (shard.scalar_type() != full.scalar_type() || shard.device() != full.device())
    throw CommError("all_gather: shard and full must have the same dtype and device");
  const auto expected = shard_range(full.numel(), size(), rank()).count;
  if (shard.numel() != expected)
    throw CommError("all_gather: rank " + std::to_string(rank()) + " passed a shard of " +
                    std::to_string(shard.numel()) + " elements, but a full tensor of " +
                    std::to_string(full.numel()) + " elements over " + std::to_string(size()) +
                    " ranks gives it " + std::to_string(expected) + " (see dtrain::shard_range)");
  const OpSignature sig{OpKind::AllGather, full.numel(), full.scalar_type(), 0};
  Impl* impl = impl_.get();
  return impl->thread->enqueue([sig](uint64_t seq) { return describe(sig, seq); },
                               [impl, sig, shard, full](uint64_t) mutable {
                                 check_if_debugging(*impl, sig);
                                 impl->backend->all_gather(shard, full);
                               });
}

WorkPtr Communicator::reduce_scatter(torch::Tensor full, torch::Tensor shard, ReduceOp op) {
  check_tensor(full, "full", "reduce_scatter");
  check_tensor(shard, "shard", "reduce_scatter");
  if (shard.scalar_type() != full.scalar_type() || shard.device() != full.device())
    throw CommError("reduce_scatter: shard and full must have the same dtype and device");
  if (op != ReduceOp::Sum && op != ReduceOp::Avg)
    throw CommError(std::string("reduce_scatter: op ") + to_string(op) + " is not supported (use sum or avg)");
  check_reduce_op(op, full.scalar_type(), "reduce_scatter");
  const auto expected = shard_range(full.numel(), size(), rank()).count;
  if (shard.numel() != expected)
    throw CommError("reduce_scatter: rank " + std::to_string(rank()) + " passed a shard of " +
                    std::to_string(shard.numel()) + " elements, but a full tensor of " +
                    std::to_string(full.numel()) + " elements over " + std::to_string(size()) +
                    " ranks gives it " + std::to_string(expected) + " (see dtrain::shard_range)");
  const OpSignature sig{OpKind::ReduceScatter, full.numel(), full.scalar_type(), static_cast<int64_t>(op)};
  Impl* impl = impl_.get();
  return impl->thread->enqueue([sig](uint64_t seq) { return describe(sig, seq); },
                               [impl, sig, full, shard, op](uint64_t) mutable {
                                 check_if_debugging(*impl, sig);
                                 reduce_in_working_precision(
                                     full, shard, op, impl->backend->size(),
                                     [&](torch::Tensor& in, torch::Tensor& out) {
                                       impl->backend->reduce_scatter(in, out, to_backend(op));
                                     });
                               });
}

WorkPtr Communicator::broadcast(torch::Tensor tensor, int root) {
  check_tensor(tensor, "tensor", "broadcast");
  check_rank(root, size(), "root", "broadcast");
  const OpSignature sig{OpKind::Broadcast, tensor.numel(), tensor.scalar_type(), root};
  Impl* impl = impl_.get();
  return impl->thread->enqueue([sig](uint64_t seq) { return describe(sig, seq); },
                               [impl, sig, tensor, root](uint64_t) mutable {
                                 check_if_debugging(*impl, sig);
                                 impl->backend->broadcast(tensor, root);
                               });
}

WorkPtr Communicator::barrier() {
  const OpSignature sig{OpKind::Barrier, 0, torch::kByte, 0};
  Impl* impl = impl_.get();
  return impl->thread->enqueue([sig](uint64_t seq) { return describe(sig, seq); },
                               [impl, sig](uint64_t) {
                                 check_if_debugging(*impl, sig);
                                 impl->backend->barrier();
                               });
}

WorkPtr Communicator::send(torch::Tensor tensor, int dst, int tag) {
  check_tensor(tensor, "tensor", "send");
  check_rank(dst, size(), "destination", "send");
  if (dst == rank()) throw CommError("send: a rank cannot send to itself (copy the tensor instead)");
  if (tag < 0) throw CommError("send: tag must be >= 0");
  Impl* impl = impl_.get();
  const auto count = tensor.numel();
  return impl->thread->enqueue(
      [=](uint64_t seq) {
        return "send #" + std::to_string(seq) + " (count=" + std::to_string(count) + ", to rank " +
               std::to_string(dst) + ", tag " + std::to_string(tag) + ")";
      },
      [impl, tensor, dst, tag](uint64_t) { impl->backend->send(tensor, dst, tag); });
}

WorkPtr Communicator::recv(torch::Tensor tensor, int src, int tag) {
  check_tensor(tensor, "tensor", "recv");
  check_rank(src, size(), "source", "recv");
  if (src == rank()) throw CommError("recv: a rank cannot receive from itself");
  if (tag < 0) throw CommError("recv: tag must be >= 0");
  Impl* impl = impl_.get();
  const auto count = tensor.numel();
  return impl->thread->enqueue(
      [=](uint64_t seq) {
        return "recv #" + std::to_string(seq) + " (count=" + std::to_string(count) + ", from rank " +
               std::to_string(src) + ", tag " + std::to_string(tag) + ")";
      },
      [impl, tensor, src, tag](uint64_t) mutable { impl->backend->recv(tensor, src, tag); });
}

std::shared_ptr<Communicator> Communicator::split(int color, int key) {
  const OpSignature sig{OpKind::Split, 0, torch::kByte, 0};
  Impl* impl = impl_.get();
  std::unique_ptr<Backend> child;
  impl->thread
      ->enqueue([sig](uint64_t seq) { return describe(sig, seq); },
                [impl, sig, color, key, &child](uint64_t) {
                  check_if_debugging(*impl, sig);
                  child = impl->backend->split(color, key);
                })
      ->wait();
  if (!child) return nullptr;
  return make_communicator(std::move(child), impl->timeout, impl->debug);
}

}  // namespace dtrain
