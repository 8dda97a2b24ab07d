// Communicator: argument checks on the caller's thread, then each operation is
// queued (see Note [issue order] in comm_thread.h). See Note [backend
// contract] in backend.h for what reaches a backend.
#include "comm/communicator_impl.h"
#include "comm/debug_check.h"

#include "common/device_spans.h"
#include "comm/work.h"

#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <iostream>
#include <optional>

namespace dtrain {

Communicator::Impl::Impl(std::unique_ptr<Backend> backend_in, std::chrono::milliseconds timeout_in, bool debug_in)
    : backend(std::move(backend_in)), timeout(timeout_in), debug(debug_in),
      thread(std::make_unique<CommThread>()) {
  backend->watch_waiters(thread->waiters());
  Backend* raw = backend.get();
  watchdog = std::make_unique<Watchdog>(*thread, timeout, [raw](const std::string& what) {
    std::cerr << "dtrain: rank " << raw->rank() << " of " << raw->size() << " (" << raw->name()
              << " communicator): watchdog: " << what
              << ". A peer rank probably died, is stuck, cannot be reached over the network (a cut link,"
                 " a host that went down), or issued a different collective (run with DTRAIN_DEBUG=1 to"
                 " check). Aborting the job."
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

void check_tensor(const Backend& backend, const torch::Tensor& t, const char* what, const char* op) {
  auto fail = [&](const std::string& why) { throw CommError(std::string(op) + ": " + what + " " + why); };
  if (!t.defined()) fail("is an undefined tensor");
  if (!t.is_contiguous()) fail("must be contiguous (call .contiguous() first)");
  if (!(t.is_cpu() || t.is_cuda())) fail("must be a CPU or CUDA tensor, got device " + t.device().str());
  switch (t.scalar_type()) {
    case torch::kFloat: case torch::kDouble: case torch::kBFloat16: case torch::kHalf:
    case torch::kInt: case torch::kLong: case torch::kByte: case torch::kBool:
      break;
    default:
      fail("has unsupported dtype " + dtype_name(t.scalar_type()) +
           " (supported: float32, float64, bfloat16, float16, int32, int64, uint8, bool)");
  }
  if (auto why_not = backend.why_unsupported(t)) fail(*why_not);
}

void check_rank(int peer, int world, const char* what, const char* op) {
  if (peer < 0 || peer >= world)
    throw CommError(std::string(op) + ": " + what + " " + std::to_string(peer) + " is not a rank of this " +
                    std::to_string(world) + "-rank communicator");
}

void check_tag(int tag, const char* op) {
  if (tag < 0 || tag > kMaxTag)
    throw CommError(std::string(op) + ": tag " + std::to_string(tag) + " is outside 0.." + std::to_string(kMaxTag));
}

// For the flat collectives: same dtype and device, and the shard this rank owns.
void check_shard(const Communicator& comm, const torch::Tensor& full, const torch::Tensor& shard, const char* op) {
  if (shard.scalar_type() != full.scalar_type() || shard.device() != full.device())
    throw CommError(std::string(op) + ": shard and full must have the same dtype and device");
  const auto expected = shard_range(full.numel(), comm.size(), comm.rank()).count;
  if (shard.numel() != expected)
    throw CommError(std::string(op) + ": rank " + std::to_string(comm.rank()) + " passed a shard of " +
                    std::to_string(shard.numel()) + " elements, but a full tensor of " +
                    std::to_string(full.numel()) + " elements over " + std::to_string(comm.size()) +
                    " ranks gives it " + std::to_string(expected) + " (see dtrain::shard_range)");
}

bool overlap(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto* a_begin = static_cast<const char*>(a.const_data_ptr());
  const auto* b_begin = static_cast<const char*>(b.const_data_ptr());
  return a_begin < b_begin + b.nbytes() && b_begin < a_begin + a.nbytes();
}

void check_reduce_op(ReduceOp op, torch::ScalarType dtype, const char* name) {
  if (op == ReduceOp::Avg && !c10::isFloatingType(dtype))
    throw CommError(std::string(name) + ": avg needs a floating-point tensor, got " + dtype_name(dtype) +
                    " (use sum and divide yourself for integers)");
  if (dtype == torch::kBool)
    throw CommError(std::string(name) + ": bool tensors cannot be reduced (use uint8 or int32)");
}

BackendReduce to_backend(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max: return BackendReduce::Max;
    case ReduceOp::Min: return BackendReduce::Min;
    default: return BackendReduce::Sum;  // Avg = Sum, then divide
  }
}

// Reductions of bf16/fp16 run in fp32 (see comm.h), into a scratch buffer
// that is copied back once; Avg divides after the sum.
torch::ScalarType working_dtype(torch::ScalarType t) { return is_low_precision(t) ? torch::kFloat : t; }
torch::Tensor widened(const torch::Tensor& t) { return t.to(working_dtype(t.scalar_type())); }
void finish_reduction(torch::Tensor& result, ReduceOp op, int world, torch::Tensor& output) {
  if (op == ReduceOp::Avg) result.div_(world);
  if (!result.is_same(output)) output.copy_(result);
}

// What an operation must see of the thread that issued it, whichever thread
// runs it (Note [issue order]): CUDA work goes on the issuing thread's current
// stream, and communication is never recorded by autograd (grad mode is
// thread-local, and in-place writes into leaves that require grad would throw).
// On CUDA tensors, once the operation has made that stream wait for its
// results, an event is recorded there (Work::completion_event), and where
// the issuer asked for it (a CommStream's scope: trace::current_device_lane)
// the operation is timed on the device as well.
struct IssuerContext {
  std::optional<c10::Stream> stream;
  std::shared_ptr<c10::Event> done;
  const char* op = nullptr;
  const char* device_lane = nullptr;
  trace::LabelValue label;

  static IssuerContext capture(const torch::Tensor& t, const char* op = nullptr) {
    IssuerContext context;
    if (!t.defined() || !t.is_cuda()) return context;
    context.stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device());
    context.done = std::make_shared<c10::Event>(c10::DeviceType::CUDA);
    context.op = op;
    context.device_lane = op ? trace::current_device_lane() : nullptr;
    context.label = trace::current_label();
    return context;
  }
  template <typename Fn>
  void run(Fn&& fn) const {
    at::NoGradGuard no_grad;
    std::optional<c10::StreamGuard> on_stream;
    if (stream) on_stream.emplace(*stream);
    trace::DeviceSpan on_device;
    if (device_lane) {
      on_device = trace::DeviceSpan(op, trace::category::device_comm, device_lane, *stream);
      if (label.key) on_device.add({label.key, label.number});
      if (label.name) on_device.add({"name", label.name});
    }
    fn();
    on_device.end();
    if (done) done->record(*stream);
  }
  // Hands the completion event to the operation's handle.
  void attach_to(const WorkPtr& work) const {
    if (!done) return;
    if (auto* state = dynamic_cast<WorkState*>(work.get())) state->set_completion_event(done);
  }
};

// Set while a Communicator::Blocking call issues its operation: the caller
// waits for it at once (Note [caller waits] in comm_thread.h).
thread_local bool t_caller_waits = false;

struct CallerWaits {
  CallerWaits() { t_caller_waits = true; }
  ~CallerWaits() { t_caller_waits = false; }
};

// Every collective goes through here: debug-mode check, then the operation,
// in the issuer's context.
WorkPtr enqueue_collective(Communicator::Impl* impl, const OpSignature& sig, const torch::Tensor& sample,
                           std::function<void(Backend&)> fn) {
  auto issue = t_caller_waits ? &CommThread::run_or_enqueue : &CommThread::enqueue;
  const IssuerContext issuer = IssuerContext::capture(sample, to_string(sig.kind));
  auto work = (impl->thread.get()->*issue)([sig](uint64_t seq) { return describe(sig, seq); },
                               [impl, sig, context = issuer, fn = std::move(fn)](uint64_t) {
                                 context.run([&] {
                                   // Executions are serialised (Note [issue order]): a plain counter.
                                   if (impl->debug)
                                     check_same_op_on_all_ranks(*impl->backend, sig, impl->collectives_run);
                                   ++impl->collectives_run;
                                   fn(*impl->backend);
                                 });
                               },
                               {to_string(sig.kind), sig.count * static_cast<int64_t>(c10::elementSize(sig.dtype))});
  issuer.attach_to(work);
  return work;
}

}  // namespace

WorkPtr Communicator::all_reduce(torch::Tensor tensor, ReduceOp op) {
  check_tensor(*impl_->backend, tensor, "tensor", "all_reduce");
  check_reduce_op(op, tensor.scalar_type(), "all_reduce");
  const int world = size();
  return enqueue_collective(impl_.get(), {OpKind::AllReduce, tensor.numel(), tensor.scalar_type(), static_cast<int64_t>(op)},
                            tensor, [tensor, op, world](Backend& backend) mutable {
                              auto work = widened(tensor);
                              backend.all_reduce(work, to_backend(op));
                              finish_reduction(work, op, world, tensor);
                            });
}

WorkPtr Communicator::all_gather(torch::Tensor shard, torch::Tensor full) {
  check_tensor(*impl_->backend, shard, "shard", "all_gather");
  check_tensor(*impl_->backend, full, "full", "all_gather");
  check_shard(*this, full, shard, "all_gather");
  // A shard that lives inside `full` (FSDP's in-place gather) is read before
  // it is overwritten: the backends need disjoint buffers.
  const bool in_place = overlap(shard, full);
  return enqueue_collective(impl_.get(), {OpKind::AllGather, full.numel(), full.scalar_type(), 0}, full,
                            [shard, full, in_place](Backend& backend) mutable {
                              backend.all_gather(in_place ? shard.clone() : shard, full);
                            });
}

WorkPtr Communicator::reduce_scatter(torch::Tensor full, torch::Tensor shard, ReduceOp op) {
  check_tensor(*impl_->backend, full, "full", "reduce_scatter");
  check_tensor(*impl_->backend, shard, "shard", "reduce_scatter");
  if (op != ReduceOp::Sum && op != ReduceOp::Avg)
    throw CommError(std::string("reduce_scatter: op ") + to_string(op) + " is not supported (use sum or avg)");
  check_reduce_op(op, full.scalar_type(), "reduce_scatter");
  check_shard(*this, full, shard, "reduce_scatter");
  const bool in_place = overlap(shard, full);
  const int world = size();
  return enqueue_collective(
      impl_.get(), {OpKind::ReduceScatter, full.numel(), full.scalar_type(), static_cast<int64_t>(op)}, full,
      [full, shard, op, world, in_place](Backend& backend) mutable {
        // Narrow dtypes and a shard inside `full` both reduce into scratch space.
        auto result = (is_low_precision(shard.scalar_type()) || in_place)
                          ? torch::empty(shard.sizes(), shard.options().dtype(working_dtype(shard.scalar_type())))
                          : shard;
        backend.reduce_scatter(widened(full), result, to_backend(op));
        finish_reduction(result, op, world, shard);
      });
}

WorkPtr Communicator::all_to_all(torch::Tensor input, torch::Tensor output) {
  check_tensor(*impl_->backend, input, "input", "all_to_all");
  check_tensor(*impl_->backend, output, "output", "all_to_all");
  if (input.scalar_type() != output.scalar_type() || input.device() != output.device())
    throw CommError("all_to_all: input and output must have the same dtype and device");
  if (input.numel() != output.numel())
    throw CommError("all_to_all: input has " + std::to_string(input.numel()) + " elements but output has " +
                    std::to_string(output.numel()) + "; they must be equal");
  if (input.numel() % size() != 0)
    throw CommError("all_to_all: " + std::to_string(input.numel()) + " elements do not split into " +
                    std::to_string(size()) + " equal chunks, one per rank");
  // Every backend needs disjoint buffers; nothing in dtrain exchanges in place.
  if (overlap(input, output)) throw CommError("all_to_all: input and output must not overlap");
  return enqueue_collective(impl_.get(), {OpKind::AllToAll, input.numel(), input.scalar_type(), 0}, input,
                            [input, output](Backend& backend) mutable { backend.all_to_all(input, output); });
}

// Note [coalescing]: the tensors are packed into one flat buffer, the
// backend runs one collective on it, and the results are unpacked. An
// all-reduce adds the same numbers as the separate calls (element by element,
// in the working dtype, with Avg's divide before the one rounding), so the
// results are the same up to the order in which a backend of more than two
// ranks happens to add them. An all-gather moves bytes: each rank's packed
// piece is its shards one after another, and the gathered buffer holds one
// such piece per rank, in rank order.
WorkPtr Communicator::all_reduce_coalesced(std::vector<torch::Tensor> tensors, ReduceOp op) {
  if (tensors.empty()) throw CommError("all_reduce_coalesced: no tensors given");
  int64_t count = 0;
  for (const auto& t : tensors) {
    check_tensor(*impl_->backend, t, "tensor", "all_reduce_coalesced");
    if (t.scalar_type() != tensors.front().scalar_type() || t.device() != tensors.front().device())
      throw CommError("all_reduce_coalesced: every tensor must have the same dtype and device (got " +
                      dtype_name(tensors.front().scalar_type()) + " and " + dtype_name(t.scalar_type()) + ")");
    count += t.numel();
  }
  check_reduce_op(op, tensors.front().scalar_type(), "all_reduce_coalesced");
  const int world = size();
  return enqueue_collective(
      impl_.get(), {OpKind::AllReduceCoalesced, count, tensors.front().scalar_type(), static_cast<int64_t>(op)},
      tensors.front(), [tensors, op, world](Backend& backend) mutable {
        std::vector<torch::Tensor> flat_views;
        flat_views.reserve(tensors.size());
        for (const auto& t : tensors) flat_views.push_back(t.reshape({-1}));
        auto packed = widened(torch::cat(flat_views));
        backend.all_reduce(packed, to_backend(op));
        if (op == ReduceOp::Avg) packed.div_(world);
        int64_t offset = 0;
        for (auto& t : tensors) {
          t.view({-1}).copy_(packed.narrow(0, offset, t.numel()));
          offset += t.numel();
        }
      });
}

WorkPtr Communicator::all_gather_coalesced(std::vector<torch::Tensor> shards, std::vector<torch::Tensor> fulls) {
  if (shards.empty() || shards.size() != fulls.size())
    throw CommError("all_gather_coalesced: needs one full tensor per shard and at least one pair (got " +
                    std::to_string(shards.size()) + " shards and " + std::to_string(fulls.size()) + " fulls)");
  const int world = size();
  int64_t piece_bytes = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    check_tensor(*impl_->backend, shards[i], "shard", "all_gather_coalesced");
    check_tensor(*impl_->backend, fulls[i], "full", "all_gather_coalesced");
    if (shards[i].scalar_type() != fulls[i].scalar_type() || shards[i].device() != fulls[i].device() ||
        shards[i].device() != shards.front().device())
      throw CommError("all_gather_coalesced: pair " + std::to_string(i) +
                      ": shard and full must have the same dtype, and every tensor the same device");
    if (fulls[i].numel() != shards[i].numel() * world)
      throw CommError("all_gather_coalesced: pair " + std::to_string(i) + ": full has " +
                      std::to_string(fulls[i].numel()) + " elements, not " + std::to_string(world) + " x the shard's " +
                      std::to_string(shards[i].numel()) + " (coalesced gathers need equal shards)");
    if (overlap(shards[i], fulls[i])) throw CommError("all_gather_coalesced: a shard must not lie inside its full tensor");
    piece_bytes += static_cast<int64_t>(shards[i].nbytes());
  }
  return enqueue_collective(
      impl_.get(), {OpKind::AllGatherCoalesced, piece_bytes * world, torch::kByte, 0}, shards.front(),
      [shards, fulls, world, piece_bytes](Backend& backend) mutable {
        auto as_bytes = [](const torch::Tensor& t) { return t.reshape({-1}).view(torch::kByte); };
        std::vector<torch::Tensor> pieces;
        pieces.reserve(shards.size());
        for (const auto& shard : shards) pieces.push_back(as_bytes(shard));
        auto packed = torch::cat(pieces);
        auto gathered = torch::empty({world * piece_bytes}, packed.options());
        backend.all_gather(packed, gathered);
        auto by_rank = gathered.view({world, piece_bytes});
        int64_t offset = 0;
        for (size_t i = 0; i < fulls.size(); ++i) {
          const int64_t bytes = static_cast<int64_t>(shards[i].nbytes());
          as_bytes(fulls[i]).view({world, bytes}).copy_(by_rank.narrow(1, offset, bytes));
          offset += bytes;
        }
      });
}

WorkPtr Communicator::broadcast(torch::Tensor tensor, int root) {
  check_tensor(*impl_->backend, tensor, "tensor", "broadcast");
  check_rank(root, size(), "root", "broadcast");
  return enqueue_collective(impl_.get(), {OpKind::Broadcast, tensor.numel(), tensor.scalar_type(), root}, tensor,
                            [tensor, root](Backend& backend) mutable { backend.broadcast(tensor, root); });
}

WorkPtr Communicator::barrier() {
  return enqueue_collective(impl_.get(), {OpKind::Barrier, 0, torch::kByte, 0}, torch::Tensor(),
                            [](Backend& backend) { backend.barrier(); });
}

WorkPtr Communicator::send(torch::Tensor tensor, int dst, int tag) {
  check_tensor(*impl_->backend, tensor, "tensor", "send");
  check_rank(dst, size(), "destination", "send");
  if (dst == rank()) throw CommError("send: a rank cannot send to itself (copy the tensor instead)");
  check_tag(tag, "send");
  Impl* impl = impl_.get();
  const auto count = tensor.numel();
  return impl->thread->enqueue(
      [=](uint64_t seq) {
        return "send #" + std::to_string(seq) + " (count=" + std::to_string(count) + ", to rank " +
               std::to_string(dst) + ", tag " + std::to_string(tag) + ")";
      },
      [impl, tensor, dst, tag, context = IssuerContext::capture(tensor)](uint64_t) {
        context.run([&] { impl->backend->send(tensor, dst, tag); });
      },
      {"send", static_cast<int64_t>(tensor.nbytes())});
}

WorkPtr Communicator::recv(torch::Tensor tensor, int src, int tag) {
  check_tensor(*impl_->backend, tensor, "tensor", "recv");
  check_rank(src, size(), "source", "recv");
  if (src == rank()) throw CommError("recv: a rank cannot receive from itself");
  check_tag(tag, "recv");
  Impl* impl = impl_.get();
  const auto count = tensor.numel();
  return impl->thread->enqueue(
      [=](uint64_t seq) {
        return "recv #" + std::to_string(seq) + " (count=" + std::to_string(count) + ", from rank " +
               std::to_string(src) + ", tag " + std::to_string(tag) + ")";
      },
      [impl, tensor, src, tag, context = IssuerContext::capture(tensor)](uint64_t) mutable {
        context.run([&] { impl->backend->recv(tensor, src, tag); });
      },
      {"recv", static_cast<int64_t>(tensor.nbytes())});
}

namespace {

// Issues with CallerWaits set and waits outside its scope, so that anything
// issued from inside the wait (nothing today) would queue as usual.
template <typename Issue>
void issue_and_wait(Issue&& issue) {
  WorkPtr work;
  {
    CallerWaits waits;
    work = issue();
  }
  work->wait();
}

}  // namespace

void Communicator::Blocking::all_reduce(torch::Tensor tensor, ReduceOp op) {
  issue_and_wait([&] { return comm_.all_reduce(std::move(tensor), op); });
}
void Communicator::Blocking::all_gather(torch::Tensor shard, torch::Tensor full) {
  issue_and_wait([&] { return comm_.all_gather(std::move(shard), std::move(full)); });
}
void Communicator::Blocking::reduce_scatter(torch::Tensor full, torch::Tensor shard, ReduceOp op) {
  issue_and_wait([&] { return comm_.reduce_scatter(std::move(full), std::move(shard), op); });
}
void Communicator::Blocking::all_to_all(torch::Tensor input, torch::Tensor output) {
  issue_and_wait([&] { return comm_.all_to_all(std::move(input), std::move(output)); });
}
void Communicator::Blocking::broadcast(torch::Tensor tensor, int root) {
  issue_and_wait([&] { return comm_.broadcast(std::move(tensor), root); });
}
void Communicator::Blocking::barrier() {
  issue_and_wait([&] { return comm_.barrier(); });
}

std::shared_ptr<Communicator> Communicator::split(int color, int key) {
  std::unique_ptr<Backend> child;
  enqueue_collective(impl_.get(), {OpKind::Split, 0, torch::kByte, 0}, torch::Tensor(),
                     [color, key, &child](Backend& backend) { child = backend.split(color, key); })
      ->wait();
  if (!child) return nullptr;
  return make_communicator(std::move(child), impl_->timeout, impl_->debug);
}

}  // namespace dtrain
