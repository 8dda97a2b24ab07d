// CUDA tensors through the c10d backend: NCCL with a GPU per rank, Gloo
// (staged in host memory) where ranks share a GPU (DTRAIN_CUDA_BACKEND,
// Note [the CUDA engine] in src/comm/c10d/c10d_backend.cpp). Skips, saying
// why, on machines without a GPU; on a GPU machine it runs under
// `dtrain launch -n N --backend c10d`, rank r on cuda:(LOCAL_RANK % GPUs).
#include <dtrain/comm.h>

#include "../common/skip_exit_code.h"
#include "comm/comm_stream.h"
#include "common/device_spans.h"
#include "common/trace_recorder.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>

namespace {

dtrain::CommPtr g_world;

class CudaCollectives : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine";
    // Its name says which engine carries CUDA tensors: "c10d (gloo; cuda: nccl)".
    if (g_world->backend_name().rfind("c10d", 0) != 0) GTEST_SKIP() << "CUDA tensors need the c10d backend";
  }
  torch::Device device() const {
    const char* local = std::getenv("LOCAL_RANK");
    const int gpus = std::max(1, static_cast<int>(torch::cuda::device_count()));
    return {torch::kCUDA, static_cast<c10::DeviceIndex>((local ? std::atoi(local) : 0) % gpus)};
  }
  // Element i of rank r: a value that is not a small integer, so rounding shows.
  torch::Tensor input(int rank, int64_t count, torch::ScalarType dtype) const {
    auto i = torch::arange(count, torch::kFloat64);
    return (torch::sin(i * 0.37 + rank * 1.7) * 3.0).to(dtype);
  }
};

TEST_F(CudaCollectives, AllReduceSumMatchesCpuReference) {
  const int n = g_world->size();
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const int64_t count = 1000003;
    auto reference = torch::zeros({count}, torch::kFloat64);
    for (int r = 0; r < n; ++r) reference += input(r, count, dtype).to(torch::kFloat64);
    auto tensor = input(g_world->rank(), count, dtype).to(device());
    g_world->all_reduce(tensor)->wait();
    auto got = tensor.cpu().to(torch::kFloat64);
    const double tolerance = dtype == torch::kBFloat16 ? 2 * 3.0 * n / 128 : 1e-5 * n;
    EXPECT_LE((got - reference.to(dtype).to(torch::kFloat64)).abs().max().item<double>(), tolerance);
  }
}

TEST_F(CudaCollectives, AllGatherAndReduceScatterRoundTrip) {
  const int n = g_world->size();
  const int64_t total = 7 * n + 3;  // uneven shards
  const auto mine = dtrain::shard_range(total, n, g_world->rank());
  auto full_in = input(0, total, torch::kFloat32).to(device());
  auto shard = full_in.narrow(0, mine.offset, mine.count).contiguous();
  auto full = torch::empty({total}, full_in.options());
  g_world->all_gather(shard, full)->wait();
  EXPECT_TRUE(torch::equal(full.cpu(), full_in.cpu()));
  auto reduced = torch::empty({mine.count}, full_in.options());
  g_world->reduce_scatter(full_in, reduced, dtrain::ReduceOp::Avg)->wait();
  EXPECT_TRUE(torch::allclose(reduced.cpu(), shard.cpu(), 1e-6, 1e-6));
}

// Kernels that keep the current stream busy for a while, so that work queued
// behind them runs late: a backend that reads or writes a tensor without
// ordering itself on that stream sees or leaves the wrong values.
class SlowStream {
 public:
  explicit SlowStream(torch::Device device)
      : busy_(torch::rand({4096, 4096}, torch::TensorOptions(torch::kFloat32).device(device))) {}
  void delay() {
    for (int i = 0; i < 8; ++i) busy_ = torch::tanh(busy_.matmul(busy_));
  }
  // A copy of `values` (on the device) made behind the delay.
  torch::Tensor late_copy(const torch::Tensor& values) {
    delay();
    return values.clone();
  }
  // A buffer whose garbage is written behind the delay: results written
  // before it (on another stream) would be overwritten.
  torch::Tensor late_garbage_like(const torch::Tensor& like) {
    auto buffer = torch::empty_like(like);
    delay();
    return buffer.fill_(-7);
  }

 private:
  torch::Tensor busy_;
};

// Every operation, with its tensors made and read on a side stream behind
// slow kernels: the backend must order its reads and writes on the issuer's
// current stream (NCCL through events, Gloo by staging on that stream;
// Note [CUDA tensors over gloo] in src/comm/c10d/c10d_backend.cpp).
TEST_F(CudaCollectives, EveryOperationOrdersOnTheIssuersStream) {
  const int n = g_world->size();
  const int me = g_world->rank();
  auto* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  c10::StreamGuard on_side_stream(cuda->getStreamFromGlobalPool(device()));
  SlowStream slow(device());
  const auto on_device = [&](const torch::Tensor& t) { return t.to(device()); };
  const auto same = [](const torch::Tensor& got, const torch::Tensor& expected) {
    return torch::equal(got.cpu(), expected);  // .cpu() waits for the side stream only
  };

  auto summed = slow.late_copy(on_device(torch::full({1000}, me + 1.0)));
  g_world->all_reduce(summed)->wait();
  EXPECT_TRUE(same(summed, torch::full({1000}, n * (n + 1) / 2.0))) << "all_reduce";

  const int64_t total = 5 * n + 2;  // uneven shards
  const auto mine = dtrain::shard_range(total, n, me);
  const auto everything = torch::arange(total, torch::kFloat32);
  auto shard = slow.late_copy(on_device(everything.narrow(0, mine.offset, mine.count)));
  auto full = slow.late_garbage_like(on_device(everything));
  g_world->all_gather(shard, full)->wait();
  EXPECT_TRUE(same(full, everything)) << "all_gather";

  auto to_reduce = slow.late_copy(on_device(everything * (me + 1)));
  auto reduced = slow.late_garbage_like(shard);
  g_world->reduce_scatter(to_reduce, reduced)->wait();
  EXPECT_TRUE(same(reduced, everything.narrow(0, mine.offset, mine.count) * (n * (n + 1) / 2))) << "reduce_scatter";

  // Chunk i of rank r holds 100 r + i; chunk j of my output comes from rank j.
  const auto chunk_ids = torch::arange(n, torch::kFloat32).repeat_interleave(3);
  auto sent = slow.late_copy(on_device(chunk_ids + 100 * me));
  auto received = slow.late_garbage_like(sent);
  g_world->all_to_all(sent, received)->wait();
  EXPECT_TRUE(same(received, chunk_ids * 100 + me)) << "all_to_all";

  const int root = n - 1;
  auto broadcast = me == root ? slow.late_copy(on_device(torch::full({257}, 42.0)))
                              : slow.late_garbage_like(on_device(torch::empty({257})));
  g_world->broadcast(broadcast, root)->wait();
  EXPECT_TRUE(same(broadcast, torch::full({257}, 42.0))) << "broadcast";

  if (n == 1) return;  // no peer to send to
  // A ring; even ranks send first, so the blocking sends and receives meet.
  auto outgoing = slow.late_copy(on_device(torch::full({33}, me + 0.5)));
  auto incoming = slow.late_garbage_like(outgoing);
  const int next = (me + 1) % n;
  const int previous = (me + n - 1) % n;
  if (me % 2 == 0) {
    g_world->send(outgoing, next)->wait();
    g_world->recv(incoming, previous)->wait();
  } else {
    g_world->recv(incoming, previous)->wait();
    g_world->send(outgoing, next)->wait();
  }
  EXPECT_TRUE(same(incoming, torch::full({33}, previous + 0.5))) << "send/recv";
}

// Note [communication streams]: an all-gather issued from a CommStream while
// the compute stream is still busy writing its input reads the finished
// input (wait_for_current), and the compute stream reads the result only
// after current_waits().
TEST_F(CudaCollectives, CommStreamOrdersAgainstTheComputeStream) {
  const int n = g_world->size();
  const int me = g_world->rank();
  dtrain::detail::CommStream comm(device(), /*enabled=*/true, "cuda test");
  ASSERT_TRUE(comm.active());
  ASSERT_NE(comm.stream(), comm.current());
  SlowStream slow(device());
  const int64_t total = 7 * n;
  const auto mine = dtrain::shard_range(total, n, me);
  const auto everything = torch::arange(total, torch::kFloat32);
  auto shard = slow.late_copy(everything.narrow(0, mine.offset, mine.count).to(device()));
  auto full = torch::empty({total}, shard.options());
  comm.wait_for_current();
  dtrain::WorkPtr work;
  {
    const dtrain::detail::CommStream::Scope on_comm(comm);
    work = g_world->all_gather(shard, full);
  }
  // Behind the gather, more work on the communication stream that the
  // compute stream must not wait for: waiting for the gather alone suffices.
  {
    const dtrain::detail::CommStream::Scope on_comm(comm);
    SlowStream(device()).delay();
  }
  work->wait();
  ASSERT_NE(work->completion_event(), nullptr) << "a CUDA operation's handle carries its completion event";
  comm.current_waits(work.get());
  EXPECT_TRUE(torch::equal((full * 1).cpu(), everything));
  comm.current_waits();  // and everything the stream holds
}

// Note [device spans]: a span around slow kernels lands, once flushed, on
// its lane with the kernels' duration, in the host's time base.
TEST_F(CudaCollectives, DeviceSpansTimeTheStreamsWork) {
  namespace trace = dtrain::trace;
  SlowStream slow(device());
  trace::start(g_world->rank());
  const int64_t before = trace::now_ns();
  {
    const trace::DeviceSpan span("slow", trace::category::device_compute, "cuda compute",
                                 trace::current_stream_of(device()));
    slow.delay();
  }
  trace::flush_device_spans(/*wait=*/true);
  const int64_t after = trace::now_ns();
  trace::stop();
  int found = 0;
  for (const auto& thread : trace::detail::snapshot()) {
    if (!thread.name || std::string(thread.name) != "cuda compute") continue;
    for (const auto& event : thread.events) {
      if (std::string(event.name) != "slow") continue;
      ++found;
      EXPECT_GT(event.duration_ns, 0);
      EXPECT_GE(event.start_ns, before - 1'000'000);  // the anchor's error is microseconds
      EXPECT_LE(event.start_ns + event.duration_ns, after + 1'000'000);
    }
  }
  EXPECT_EQ(found, 1);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  g_world = dtrain::init(argc, argv);
  const int failed = RUN_ALL_TESTS();
  g_world.reset();
  return dtrain::testing::skip_exit_code_if_all_skipped(failed);
}
