// CUDA tensors through the c10d backend (NCCL). Skips, saying why, on machines
// without a GPU; on a GPU machine it runs under `dtrain launch --backend c10d`
// with one rank per device.
#include <dtrain/comm.h>

#include "../common/skip_exit_code.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdlib>

namespace {

dtrain::CommPtr g_world;

class CudaCollectives : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine";
    if (g_world->backend_name() != "c10d") GTEST_SKIP() << "CUDA tensors need the c10d backend (NCCL)";
  }
  torch::Device device() const {
    const char* local = std::getenv("LOCAL_RANK");
    return {torch::kCUDA, static_cast<c10::DeviceIndex>(local ? std::atoi(local) : 0)};
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

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  g_world = dtrain::init(argc, argv);
  const int failed = RUN_ALL_TESTS();
  g_world.reset();
  return dtrain::testing::skip_exit_code_if_all_skipped(failed);
}
