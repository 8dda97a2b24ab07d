// Multi-rank tests of dtrain::Communicator (include/dtrain/comm.h).
//
// Every rank runs every test, in the same order, so every rank issues the same
// collectives. Run under the launcher:
//   dtrain launch -n N --backend mpi|c10d -- test_comm
// (or plain, as a one-rank world). Inputs are deterministic functions of
// (rank, index, salt) that every rank can evaluate for every other rank, so
// each rank computes its references locally: in float64 / int64 from the
// dtype-rounded inputs, rounded once at the end.
// Rules for writing tests: tests/common/multirank_gtest.h.
#include <dtrain/comm.h>

#include "../common/multirank_gtest.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace {

using dtrain::CommError;
using dtrain::ReduceOp;

using dtrain::testing::world;

const std::vector<torch::ScalarType> kDtypes = {torch::kFloat, torch::kDouble, torch::kBFloat16,
                                                torch::kHalf,  torch::kInt,    torch::kLong};
// Full sizes: empty, one element (fewer elements than ranks), uneven (7 over
// 2, 3 or 4 ranks) and large (uneven over 3 ranks, exercises real algorithms).
const std::vector<int64_t> kCounts = {0, 1, 7, 1000000};

bool is_floating(torch::ScalarType t) { return c10::isFloatingType(t); }
torch::ScalarType wide_type(torch::ScalarType t) { return is_floating(t) ? torch::kDouble : torch::kLong; }

using dtrain::dtype_name;

// What rank `rank` contributes at flat indices [offset, offset + count), in
// `dtype`. Floats are sin-based, so they are not small integers and the
// rounding of sums matters; int64 values exceed the int32 range.
torch::Tensor input(torch::ScalarType dtype, int rank, int64_t offset, int64_t count, int salt) {
  if (is_floating(dtype)) {
    auto i = torch::arange(offset, offset + count, torch::kDouble);
    auto values = torch::sin(i * 0.7548776662466927 + (rank * 1.618033988749895 + salt * 0.5772156649)) * 3.3 +
                  0.1 * (rank + 1);
    return values.to(dtype);
  }
  auto i = torch::arange(offset, offset + count, torch::kLong);
  auto values = (i * 40503 + rank * 977 + salt * 131) % 2001 - 1000;
  if (dtype == torch::kLong) values = values + (static_cast<int64_t>(rank + 1) << 36);
  return values.to(dtype);
}

// The exact reduction of every rank's input over [offset, offset + count), in
// float64 / int64 (not yet rounded to the dtype).
torch::Tensor reference(ReduceOp op, torch::ScalarType dtype, int world_size, int64_t offset, int64_t count,
                        int salt) {
  torch::Tensor acc;
  for (int r = 0; r < world_size; ++r) {
    auto x = input(dtype, r, offset, count, salt).to(wide_type(dtype));
    if (!acc.defined()) {
      acc = x;
      continue;
    }
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc = acc + x; break;
      case ReduceOp::Max: acc = torch::maximum(acc, x); break;
      case ReduceOp::Min: acc = torch::minimum(acc, x); break;
    }
  }
  if (op == ReduceOp::Avg) acc = acc / world_size;
  return acc;
}

// Relative tolerance per element: one unit in the last place of the result
// (eps(dtype) * |ref| >= ulp(ref)), which a single rounding of an fp32 sum
// meets and N-1 roundings in bf16/fp16 generally do not.
double rtol_of(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return 1e-6;
    case torch::kDouble: return 1e-12;
    case torch::kBFloat16: return 1.0 / 128;  // 2^-7
    case torch::kHalf: return 1.0 / 1024;     // 2^-10
    default: return 0.0;
  }
}

// `actual` (of `dtype`) against the unrounded reference `ref` (float64 or
// int64). Integers and `exact` cases (max, min, data movement) must match
// bit for bit after rounding the reference to the dtype.
::testing::AssertionResult matches(const torch::Tensor& actual, const torch::Tensor& ref, torch::ScalarType dtype,
                                   bool exact, const std::string& what) {
  if (actual.scalar_type() != dtype)
    return ::testing::AssertionFailure() << what << ": result has dtype " << dtype_name(actual.scalar_type())
                                         << ", expected " << dtype_name(dtype);
  if (actual.numel() != ref.numel())
    return ::testing::AssertionFailure() << what << ": result has " << actual.numel() << " elements, expected "
                                         << ref.numel();
  if (ref.numel() == 0) return ::testing::AssertionSuccess();
  const auto flat_actual = actual.reshape({-1});
  const auto flat_ref = ref.reshape({-1});
  if (exact || !is_floating(dtype)) {
    const auto expected = flat_ref.to(dtype);
    const auto bad = flat_actual.ne(expected);
    if (!bad.any().item<bool>()) return ::testing::AssertionSuccess();
    const auto index = bad.nonzero()[0][0].item<int64_t>();
    return ::testing::AssertionFailure()
           << what << ": " << bad.sum().item<int64_t>() << " of " << ref.numel()
           << " elements differ (exact match required); first at index " << index << ": got "
           << flat_actual[index].to(torch::kDouble).item<double>() << ", expected "
           << expected[index].to(torch::kDouble).item<double>();
  }
  const auto got = flat_actual.to(torch::kDouble);
  const double max_abs = flat_ref.abs().max().item<double>();
  const double rtol = rtol_of(dtype);
  // Covers fp32 accumulation noise (and fp16 subnormals) near zero.
  const double atol = 1e-6 * max_abs + (dtype == torch::kDouble ? 0.0 : 1e-7);
  const auto tolerance = flat_ref.abs() * rtol + (dtype == torch::kDouble ? 1e-12 * max_abs : atol);
  const auto error = (got - flat_ref).abs();
  const auto bad = error.gt(tolerance).logical_or(got.isnan());
  if (!bad.any().item<bool>()) return ::testing::AssertionSuccess();
  const auto index = bad.nonzero()[0][0].item<int64_t>();
  return ::testing::AssertionFailure()
         << what << ": " << bad.sum().item<int64_t>() << " of " << ref.numel()
         << " elements outside tolerance; first at index " << index << ": got "
         << got[index].item<double>() << ", expected " << flat_ref[index].item<double>() << " (rounded to "
         << dtype_name(dtype) << ": " << flat_ref[index].to(dtype).to(torch::kDouble).item<double>()
         << "), tolerance " << tolerance[index].item<double>() << ", max error "
         << error.max().item<double>();
}

std::string describe_case(const char* op, torch::ScalarType dtype, int64_t count, const std::string& extra = "") {
  std::ostringstream out;
  out << "rank " << world().rank() << "/" << world().size() << " " << world().backend_name() << ": " << op << " "
      << dtype_name(dtype) << " count=" << count << extra;
  return out.str();
}

// A value no input takes, so elements a collective forgot to write show up.
torch::Tensor sentinel_filled(int64_t count, torch::ScalarType dtype) {
  return torch::full({count}, is_floating(dtype) ? 1000.0 : -77777.0, torch::TensorOptions().dtype(dtype));
}

// Waits and checks the handle reports completion afterwards.
void wait_completed(const dtrain::WorkPtr& work, const std::string& what) {
  ASSERT_NE(work, nullptr) << what;
  work->wait();
  EXPECT_TRUE(work->is_completed()) << what << ": is_completed() is false after wait()";
}

// ---------------------------------------------------------------------------
// The world itself.

TEST(World, MatchesTheLaunchEnvironment) {
  const char* ompi_size = std::getenv("OMPI_COMM_WORLD_SIZE");
  const char* ompi_rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* c10d_size = std::getenv("WORLD_SIZE");
  const char* c10d_rank = std::getenv("RANK");
  if (ompi_size != nullptr && ompi_rank != nullptr) {
    EXPECT_EQ(world().backend_name(), "mpi");
    EXPECT_EQ(world().size(), std::atoi(ompi_size));
    EXPECT_EQ(world().rank(), std::atoi(ompi_rank));
  } else if (c10d_size != nullptr && c10d_rank != nullptr) {
    // "c10d (gloo; cuda: nccl|gloo)": the engine for CUDA tensors (DTRAIN_CUDA_BACKEND).
    const std::string name = world().backend_name();
    EXPECT_EQ(name.rfind("c10d (gloo; cuda: ", 0), 0u) << name;
    const char* cuda_backend = std::getenv("DTRAIN_CUDA_BACKEND");
    if (cuda_backend != nullptr && std::string(cuda_backend) == "gloo") {
      EXPECT_EQ(name, "c10d (gloo; cuda: gloo)");
    }
    EXPECT_EQ(world().size(), std::atoi(c10d_size));
    EXPECT_EQ(world().rank(), std::atoi(c10d_rank));
  } else {
    EXPECT_EQ(world().size(), 1);
    EXPECT_EQ(world().rank(), 0);
  }
  EXPECT_GE(world().rank(), 0);
  EXPECT_LT(world().rank(), world().size());
  if (const char* timeout = std::getenv("DTRAIN_TIMEOUT"); timeout != nullptr && *timeout != '\0') {
    EXPECT_EQ(world().timeout().count(), static_cast<int64_t>(std::strtod(timeout, nullptr) * 1000.0));
  } else {
    EXPECT_EQ(world().timeout().count(), 300000);
  }
}

TEST(ShardRange, SplitsAsEvenlyAsPossibleFirstRanksLarger) {
  const int64_t expected[3][2] = {{0, 3}, {3, 2}, {5, 2}};
  for (int r = 0; r < 3; ++r) {
    const auto range = dtrain::shard_range(7, 3, r);
    EXPECT_EQ(range.offset, expected[r][0]) << "rank " << r;
    EXPECT_EQ(range.count, expected[r][1]) << "rank " << r;
  }
  // Coverage without gaps or overlap for many shapes.
  for (int w = 1; w <= 5; ++w) {
    for (int64_t total : {0, 1, 2, 7, 10, 1000001}) {
      int64_t next = 0;
      for (int r = 0; r < w; ++r) {
        const auto range = dtrain::shard_range(total, w, r);
        EXPECT_EQ(range.offset, next) << total << " over " << w << ", rank " << r;
        EXPECT_TRUE(range.count == total / w || range.count == total / w + 1) << total << " over " << w;
        EXPECT_EQ(range.count, total / w + (r < total % w ? 1 : 0)) << total << " over " << w << ", rank " << r;
        next = range.offset + range.count;
      }
      EXPECT_EQ(next, total) << total << " over " << w;
    }
  }
  EXPECT_THROW(dtrain::shard_range(7, 0, 0), CommError);
  EXPECT_THROW(dtrain::shard_range(7, 3, 3), CommError);
  EXPECT_THROW(dtrain::shard_range(7, 3, -1), CommError);
  EXPECT_THROW(dtrain::shard_range(-1, 3, 0), CommError);
}

// ---------------------------------------------------------------------------
// Every collective x every dtype x every count.

class Collectives : public ::testing::TestWithParam<torch::ScalarType> {};

TEST_P(Collectives, AllReduce) {
  const auto dtype = GetParam();
  const int world_size = world().size();
  int salt = 0;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    for (int64_t count : kCounts) {
      ++salt;
      const auto what = describe_case("all_reduce", dtype, count, std::string(" op=") + dtrain::to_string(op));
      auto tensor = input(dtype, world().rank(), 0, count, salt);
      if (op == ReduceOp::Avg && !is_floating(dtype)) {
        const auto before = tensor.clone();
        EXPECT_THROW(world().all_reduce(tensor, op), CommError) << what << ": avg on integers must throw";
        EXPECT_TRUE(torch::equal(tensor, before)) << what << ": a rejected call modified its tensor";
        continue;
      }
      wait_completed(world().all_reduce(tensor, op), what);
      const bool exact = op == ReduceOp::Max || op == ReduceOp::Min;
      EXPECT_TRUE(matches(tensor, reference(op, dtype, world_size, 0, count, salt), dtype, exact, what));
    }
  }
}

TEST_P(Collectives, AllReduceKeepsShape) {
  const auto dtype = GetParam();
  const int salt = 40;
  auto tensor = input(dtype, world().rank(), 0, 15, salt).reshape({3, 5});
  const auto what = describe_case("all_reduce", dtype, 15, " shape={3,5}");
  wait_completed(world().all_reduce(tensor), what);
  EXPECT_EQ(tensor.sizes(), torch::IntArrayRef({3, 5})) << what;
  EXPECT_TRUE(matches(tensor, reference(ReduceOp::Sum, dtype, world().size(), 0, 15, salt), dtype, false, what));
}

TEST_P(Collectives, AllGather) {
  const auto dtype = GetParam();
  const int world_size = world().size();
  const int rank = world().rank();
  int salt = 100;
  for (int64_t count : kCounts) {
    ++salt;
    const auto what = describe_case("all_gather", dtype, count);
    const auto mine = dtrain::shard_range(count, world_size, rank);
    auto shard = input(dtype, rank, mine.offset, mine.count, salt);
    const auto shard_before = shard.clone();
    auto full = sentinel_filled(count, dtype);
    wait_completed(world().all_gather(shard, full), what);
    std::vector<torch::Tensor> pieces;
    for (int r = 0; r < world_size; ++r) {
      const auto range = dtrain::shard_range(count, world_size, r);
      pieces.push_back(input(dtype, r, range.offset, range.count, salt).to(wide_type(dtype)));
    }
    EXPECT_TRUE(matches(full, torch::cat(pieces), dtype, /*exact=*/true, what));
    EXPECT_TRUE(torch::equal(shard, shard_before)) << what << ": all_gather modified its shard";
  }
}

TEST_P(Collectives, ReduceScatter) {
  const auto dtype = GetParam();
  const int world_size = world().size();
  const int rank = world().rank();
  int salt = 200;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    for (int64_t count : kCounts) {
      ++salt;
      const auto what = describe_case("reduce_scatter", dtype, count, std::string(" op=") + dtrain::to_string(op));
      const auto mine = dtrain::shard_range(count, world_size, rank);
      auto full = input(dtype, rank, 0, count, salt);
      const auto full_before = full.clone();
      auto shard = sentinel_filled(mine.count, dtype);
      if (op == ReduceOp::Avg && !is_floating(dtype)) {
        EXPECT_THROW(world().reduce_scatter(full, shard, op), CommError) << what << ": avg on integers must throw";
        continue;
      }
      wait_completed(world().reduce_scatter(full, shard, op), what);
      EXPECT_TRUE(
          matches(shard, reference(op, dtype, world_size, mine.offset, mine.count, salt), dtype, false, what));
      EXPECT_TRUE(torch::equal(full, full_before)) << what << ": reduce_scatter modified its input `full`";
    }
  }
}

// Chunk j of rank r's input lands as chunk r of rank j's output, byte for
// byte (all_to_all moves data and reduces nothing, so bf16 stays bf16).
TEST_P(Collectives, AllToAll) {
  const auto dtype = GetParam();
  const int world_size = world().size();
  const int rank = world().rank();
  int salt = 250;
  for (int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{1000}}) {
    ++salt;
    const auto what = describe_case("all_to_all", dtype, chunk * world_size);
    auto in = input(dtype, rank, 0, chunk * world_size, salt);
    const auto in_before = in.clone();
    auto out = sentinel_filled(chunk * world_size, dtype);
    wait_completed(world().all_to_all(in, out), what);
    std::vector<torch::Tensor> expected;
    for (int r = 0; r < world_size; ++r)
      expected.push_back(input(dtype, r, 0, chunk * world_size, salt).narrow(0, rank * chunk, chunk).to(wide_type(dtype)));
    EXPECT_TRUE(matches(out, torch::cat(expected), dtype, /*exact=*/true, what));
    EXPECT_TRUE(torch::equal(in, in_before)) << what << ": all_to_all modified its input";
  }
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  const auto dtype = GetParam();
  const int rank = world().rank();
  int salt = 300;
  for (int64_t count : kCounts) {
    for (int root = 0; root < world().size(); ++root) {
      ++salt;
      const auto what = describe_case("broadcast", dtype, count, " root=" + std::to_string(root));
      auto tensor = input(dtype, rank, 0, count, salt);
      wait_completed(world().broadcast(tensor, root), what);
      EXPECT_TRUE(matches(tensor, input(dtype, root, 0, count, salt).to(wide_type(dtype)), dtype, true, what));
    }
  }
}

// Each rank sends to (r+1)%N and receives from (r-1+N)%N, tag 7. Even ranks
// send first and odd ranks receive first: an operation (send included) holds
// the communicator's thread until its peer matches it, so all-send-first
// would rely on the transport buffering the message.
TEST_P(Collectives, SendRecvRing) {
  const int world_size = world().size();
  if (world_size == 1) GTEST_SKIP() << "send/recv needs two ranks";
  const auto dtype = GetParam();
  const int rank = world().rank();
  const int next = (rank + 1) % world_size;
  const int prev = (rank - 1 + world_size) % world_size;
  int salt = 400;
  for (int64_t count : {int64_t{0}, int64_t{7}, int64_t{1000}}) {
    const int first_salt = salt + 1;
    constexpr int kMessages = 3;  // several messages on one pair and tag match in issue order
    std::vector<torch::Tensor> received;
    std::vector<dtrain::WorkPtr> works;
    auto issue_sends = [&] {
      for (int m = 0; m < kMessages; ++m)
        works.push_back(world().send(input(dtype, rank, 0, count, first_salt + m), next, 7));
    };
    auto issue_recvs = [&] {
      for (int m = 0; m < kMessages; ++m) {
        received.push_back(sentinel_filled(count, dtype));
        works.push_back(world().recv(received.back(), prev, 7));
      }
    };
    if (rank % 2 == 0) {
      issue_sends();
      issue_recvs();
    } else {
      issue_recvs();
      issue_sends();
    }
    salt += kMessages;
    for (auto& work : works) wait_completed(work, describe_case("send/recv ring", dtype, count));
    for (int m = 0; m < kMessages; ++m) {
      const auto what = describe_case("recv", dtype, count,
                                      " message " + std::to_string(m) + " from rank " + std::to_string(prev));
      EXPECT_TRUE(matches(received[m], input(dtype, prev, 0, count, first_salt + m).to(wide_type(dtype)), dtype,
                          true, what));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Collectives, ::testing::ValuesIn(kDtypes),
                         [](const ::testing::TestParamInfo<torch::ScalarType>& info) {
                           return dtype_name(info.param);
                         });

// ---------------------------------------------------------------------------
// Low-precision reductions are done in fp32 and rounded once.

// Rank 0 contributes `big`, every other rank 1. In fp32 the sum is exact and
// rounds once to the dtype; accumulating in the dtype itself loses every +1
// (big + 1 is a tie that rounds back to big).
void check_single_rounding(torch::ScalarType dtype, double big) {
  const int world_size = world().size();
  if (world_size < 2) GTEST_SKIP() << "needs at least two ranks";
  const int rank = world().rank();
  const int64_t n = 1000;
  const double mine = rank == 0 ? big : 1.0;
  const float exact_sum = static_cast<float>(big + (world_size - 1));
  const auto expected_sum = torch::full({n}, exact_sum, torch::kFloat).to(dtype);
  const auto expected_avg = (torch::full({n}, exact_sum, torch::kFloat) / world_size).to(dtype);

  // What accumulating in the dtype in rank order would give: the test only
  // discriminates when this differs (world >= 3).
  auto naive = torch::full({1}, big, torch::kFloat).to(dtype);
  for (int r = 1; r < world_size; ++r) naive = naive + torch::ones({1}, torch::TensorOptions().dtype(dtype));
  if (world_size >= 3) {
    EXPECT_NE(naive.to(torch::kDouble).item<double>(), expected_sum[0].to(torch::kDouble).item<double>())
        << "test setup: the naive and the correctly rounded sums should differ";
  }

  auto sum = torch::full({n}, mine, torch::TensorOptions().dtype(dtype));
  auto avg = torch::full({n}, mine, torch::TensorOptions().dtype(dtype));
  auto full = torch::full({n * world_size}, mine, torch::TensorOptions().dtype(dtype));
  auto shard = torch::zeros({n}, torch::TensorOptions().dtype(dtype));
  auto shard_avg = torch::zeros({n}, torch::TensorOptions().dtype(dtype));
  auto w1 = world().all_reduce(sum, ReduceOp::Sum);
  auto w2 = world().all_reduce(avg, ReduceOp::Avg);
  auto w3 = world().reduce_scatter(full, shard, ReduceOp::Sum);
  auto w4 = world().reduce_scatter(full, shard_avg, ReduceOp::Avg);
  for (auto& w : {w1, w2, w3, w4}) wait_completed(w, describe_case("low-precision reductions", dtype, n));
  auto report = [&](const char* what, const torch::Tensor& t, const torch::Tensor& expected) {
    EXPECT_TRUE(torch::equal(t, expected))
        << describe_case(what, dtype, n) << ": got " << t[0].to(torch::kDouble).item<double>() << ", expected "
        << expected[0].to(torch::kDouble).item<double>() << " (fp32 sum " << exact_sum
        << " rounded once; accumulating in " << dtype_name(dtype) << " gives "
        << naive.to(torch::kDouble).item<double>() << ")";
  };
  report("all_reduce sum", sum, expected_sum);
  report("all_reduce avg", avg, expected_avg);
  report("reduce_scatter sum", shard, expected_sum);
  report("reduce_scatter avg", shard_avg, expected_avg);
}

TEST(Accuracy, BFloat16SumIsRoundedOnce) { check_single_rounding(torch::kBFloat16, 256.0); }
TEST(Accuracy, Float16SumIsRoundedOnce) { check_single_rounding(torch::kHalf, 2048.0); }

// ---------------------------------------------------------------------------
// Barrier: nobody leaves before everyone arrived. Each rank drops a file in a
// directory shared by the job before the barrier and, after it, must see
// every rank's file. Rank 0 arrives late to make an early exit visible.

TEST(Barrier, NoRankLeavesBeforeAllArrived) {
  const int world_size = world().size();
  const int rank = world().rank();
  namespace fs = std::filesystem;
  // A job-unique directory name, chosen by rank 0.
  auto id = torch::zeros({1}, torch::kLong);
  if (rank == 0)
    id[0] = static_cast<int64_t>(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000000) * 100 +
            (::getpid() % 100);
  wait_completed(world().broadcast(id, 0), "broadcast of the barrier directory id");
  const fs::path dir = fs::temp_directory_path() / ("dtrain_test_barrier_" + std::to_string(id.item<int64_t>()));
  fs::create_directories(dir);
  for (int round = 0; round < 3; ++round) {
    if (rank == round % world_size) std::this_thread::sleep_for(std::chrono::milliseconds(150));
    std::ofstream(dir / ("round" + std::to_string(round) + "_rank" + std::to_string(rank))) << rank;
    wait_completed(world().barrier(), "barrier");
    for (int r = 0; r < world_size; ++r) {
      EXPECT_TRUE(fs::exists(dir / ("round" + std::to_string(round) + "_rank" + std::to_string(r))))
          << "rank " << rank << " left barrier round " << round << " before rank " << r << " arrived";
    }
  }
  wait_completed(world().barrier(), "barrier before cleanup");
  if (rank == 0) fs::remove_all(dir);
}

// ---------------------------------------------------------------------------
// Asynchronous issue: many operations in flight at once.

TEST(Async, HundredMixedOpsIssuedBackToBack) {
  const int world_size = world().size();
  const int rank = world().rank();
  constexpr int kOps = 100;
  struct Pending {
    dtrain::WorkPtr work;
    std::function<::testing::AssertionResult()> check;
  };
  std::vector<Pending> pending;
  for (int k = 0; k < kOps; ++k) {
    const auto dtype = kDtypes[k % kDtypes.size()];
    const int64_t count = 1 + (k * 7919) % 3001;  // mostly not a multiple of the world size
    const int salt = 1000 + k;
    const auto what = describe_case("async op", dtype, count, " #" + std::to_string(k));
    switch (k % 4) {
      case 0: {
        const ReduceOp op = k % 8 == 0 ? ReduceOp::Sum : ReduceOp::Max;
        auto tensor = input(dtype, rank, 0, count, salt);
        pending.push_back({world().all_reduce(tensor, op), [=] {
                             return matches(tensor, reference(op, dtype, world_size, 0, count, salt), dtype,
                                            op == ReduceOp::Max, what + " all_reduce");
                           }});
        break;
      }
      case 1: {
        const auto mine = dtrain::shard_range(count, world_size, rank);
        auto shard = input(dtype, rank, mine.offset, mine.count, salt);
        auto full = sentinel_filled(count, dtype);
        pending.push_back({world().all_gather(shard, full), [=] {
                             std::vector<torch::Tensor> pieces;
                             for (int r = 0; r < world_size; ++r) {
                               const auto range = dtrain::shard_range(count, world_size, r);
                               pieces.push_back(input(dtype, r, range.offset, range.count, salt).to(wide_type(dtype)));
                             }
                             return matches(full, torch::cat(pieces), dtype, true, what + " all_gather");
                           }});
        break;
      }
      case 2: {
        const int root = k % world_size;
        auto tensor = input(dtype, rank, 0, count, salt);
        pending.push_back({world().broadcast(tensor, root), [=] {
                             return matches(tensor, input(dtype, root, 0, count, salt).to(wide_type(dtype)), dtype,
                                            true, what + " broadcast root=" + std::to_string(root));
                           }});
        break;
      }
      default: {
        const auto mine = dtrain::shard_range(count, world_size, rank);
        auto full = input(dtype, rank, 0, count, salt);
        auto shard = sentinel_filled(mine.count, dtype);
        pending.push_back({world().reduce_scatter(full, shard, ReduceOp::Sum), [=] {
                             return matches(shard,
                                            reference(ReduceOp::Sum, dtype, world_size, mine.offset, mine.count, salt),
                                            dtype, false, what + " reduce_scatter");
                           }});
        break;
      }
    }
  }
  // Operations run in issue order: once the last one is done, all are.
  wait_completed(pending.back().work, "the last async op");
  int not_completed = 0;
  for (const auto& p : pending) not_completed += p.work->is_completed() ? 0 : 1;
  EXPECT_EQ(not_completed, 0) << "operations still running after a later one completed";
  for (int k = 0; k < kOps; ++k) {
    wait_completed(pending[k].work, "async op #" + std::to_string(k));
    EXPECT_TRUE(pending[k].check());
  }
}

// The small-operation path (issue 18): 10,000 back-to-back 4 KiB all-reduces,
// all in flight at once, finish in issue order with the right sums. Under the
// mpi backend's default wait (docs/communicator.md, "Waiting") these are
// blocking MPI calls; the DTRAIN_COMM_NONBLOCKING_MIN_BYTES=0 variant in
// CMakeLists.txt runs the same through MPI_Iallreduce and the test loop.
TEST(Async, TenThousandSmallAllReducesInIssueOrder) {
  const int world_size = world().size();
  const int rank = world().rank();
  constexpr int kOps = 10000;
  constexpr int64_t kCount = 1024;  // 4 KiB of float32
  std::vector<torch::Tensor> tensors;
  std::vector<dtrain::WorkPtr> works;
  tensors.reserve(kOps);
  works.reserve(kOps);
  for (int k = 0; k < kOps; ++k) {
    // Rank r contributes k * (r + 1): the sum is k * world (world + 1) / 2,
    // exact in float32 for these magnitudes, and different for every k.
    tensors.push_back(torch::full({kCount}, static_cast<float>(k) * static_cast<float>(rank + 1)));
    works.push_back(world().all_reduce(tensors.back()));
  }
  int out_of_order = 0;
  for (int k = kOps - 1; k >= 0; k -= 997) {
    wait_completed(works[k], "all_reduce #" + std::to_string(k));
    for (int j = 0; j < k; ++j) out_of_order += works[j]->is_completed() ? 0 : 1;
  }
  EXPECT_EQ(out_of_order, 0) << "operations still pending after a later one completed";
  int wrong = 0;
  for (int k = 0; k < kOps; ++k) {
    wait_completed(works[k], "all_reduce #" + std::to_string(k));
    const float expected = static_cast<float>(k) * static_cast<float>(world_size * (world_size + 1) / 2);
    if (!torch::equal(tensors[k], torch::full({kCount}, expected))) ++wrong;
  }
  EXPECT_EQ(wrong, 0) << "of " << kOps << " all-reduces gave a wrong sum";
}

// ---------------------------------------------------------------------------
// Blocking calls (Note [caller waits]) and coalesced collectives (Note
// [coalescing]): the same results as the queued, separate calls.

// Every dtype and size, through Communicator::blocking(), against the exact
// reference; a blocking call issued while queued operations are pending runs
// behind them, so all finish in issue order with the right results.
TEST(Blocking, EveryCollectiveMatchesTheReference) {
  const int n = world().size();
  const int rank = world().rank();
  for (auto dtype : kDtypes) {
    for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{1000}}) {
      const std::string what = "blocking " + dtype_name(dtype) + " count " + std::to_string(count);
      auto reduced = input(dtype, rank, 0, count, 41);
      world().blocking().all_reduce(reduced, ReduceOp::Sum);
      EXPECT_TRUE(matches(reduced, reference(ReduceOp::Sum, dtype, n, 0, count, 41), dtype, false, what + " all_reduce"));

      const int64_t full_count = count * n;
      auto gathered = torch::empty({full_count}, torch::dtype(dtype));
      world().blocking().all_gather(input(dtype, rank, rank * count, count, 42), gathered);
      std::vector<torch::Tensor> expected;
      for (int r = 0; r < n; ++r) expected.push_back(input(dtype, r, r * count, count, 42));
      EXPECT_TRUE(matches(gathered, torch::cat(expected).to(wide_type(dtype)), dtype, true, what + " all_gather"));

      auto shard = torch::empty({count}, torch::dtype(dtype));
      world().blocking().reduce_scatter(input(dtype, rank, 0, full_count, 43), shard, ReduceOp::Sum);
      EXPECT_TRUE(matches(shard, reference(ReduceOp::Sum, dtype, n, rank * count, count, 43), dtype, false,
                          what + " reduce_scatter"));

      auto from_root = input(dtype, rank, 0, count, 44);
      world().blocking().broadcast(from_root, n - 1);
      EXPECT_TRUE(matches(from_root, input(dtype, n - 1, 0, count, 44).to(wide_type(dtype)), dtype, true,
                          what + " broadcast"));
    }
  }
  world().blocking().barrier();
}

TEST(Blocking, RunsBehindQueuedOperationsInIssueOrder) {
  const int n = world().size();
  std::vector<torch::Tensor> queued;
  std::vector<dtrain::WorkPtr> works;
  for (int k = 0; k < 50; ++k) {
    queued.push_back(torch::full({4096}, static_cast<float>(k)));
    works.push_back(world().all_reduce(queued.back()));
  }
  auto last = torch::full({16}, 1.0f);
  world().blocking().all_reduce(last);
  int pending = 0;
  for (const auto& work : works) pending += work->is_completed() ? 0 : 1;
  EXPECT_EQ(pending, 0) << "queued operations still pending after a blocking call issued behind them returned";
  EXPECT_TRUE(torch::equal(last, torch::full({16}, static_cast<float>(n))));
  for (int k = 0; k < 50; ++k) {
    works[k]->wait();
    EXPECT_TRUE(torch::equal(queued[k], torch::full({4096}, static_cast<float>(k * n)))) << "all_reduce #" << k;
  }
}

TEST(Coalesced, AllReduceEqualsTheSeparateCalls) {
  const int n = world().size();
  const int rank = world().rank();
  for (auto dtype : kDtypes) {
    for (auto op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      if (op == ReduceOp::Avg && !is_floating(dtype)) continue;
      const std::vector<int64_t> counts = {3, 1, 0, 1000, 17};
      std::vector<torch::Tensor> coalesced, separate;
      int64_t offset = 0;
      for (int64_t count : counts) {
        // Shapes other than flat ones, so packing must flatten and restore them.
        auto x = input(dtype, rank, offset, count, 50 + static_cast<int>(op)).reshape({1, count});
        coalesced.push_back(x.clone());
        separate.push_back(x.clone());
        offset += count;
      }
      world().all_reduce_coalesced(coalesced, op)->wait();
      for (auto& t : separate) world().all_reduce(t, op)->wait();
      offset = 0;
      for (size_t i = 0; i < counts.size(); ++i) {
        const std::string what = "all_reduce_coalesced " + dtype_name(dtype) + " " + dtrain::to_string(op) +
                                 " tensor " + std::to_string(i);
        EXPECT_EQ(coalesced[i].sizes(), separate[i].sizes()) << what;
        // Two ranks add in one order whatever the buffer; more may not.
        const bool exact = n <= 2 || op == ReduceOp::Max || !is_floating(dtype);
        EXPECT_TRUE(matches(coalesced[i], separate[i].to(wide_type(dtype)), dtype, exact, what + " vs separate"));
        EXPECT_TRUE(matches(coalesced[i], reference(op, dtype, n, offset, counts[i], 50 + static_cast<int>(op)), dtype,
                            op == ReduceOp::Max, what + " vs reference"));
        offset += counts[i];
      }
    }
  }
}

TEST(Coalesced, AllGatherOfMixedDtypesEqualsTheSeparateCalls) {
  const int n = world().size();
  const int rank = world().rank();
  const std::vector<std::pair<torch::ScalarType, int64_t>> pairs = {
      {torch::kFloat, 5}, {torch::kLong, 3}, {torch::kBFloat16, 1}, {torch::kInt, 0}, {torch::kByte, 9}};
  std::vector<torch::Tensor> shards, coalesced, separate;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto [dtype, count] = pairs[i];
    shards.push_back(dtype == torch::kByte ? torch::arange(count, torch::kLong).add(rank * 7).remainder(256).to(dtype)
                                           : input(dtype, rank, 0, count, 60 + static_cast<int>(i)));
    coalesced.push_back(torch::empty({n * count}, torch::dtype(dtype)));
    separate.push_back(torch::empty({n * count}, torch::dtype(dtype)));
  }
  world().all_gather_coalesced(shards, coalesced)->wait();
  for (size_t i = 0; i < pairs.size(); ++i) world().all_gather(shards[i], separate[i])->wait();
  for (size_t i = 0; i < pairs.size(); ++i)
    EXPECT_TRUE(torch::equal(coalesced[i], separate[i])) << "all_gather_coalesced pair " << i << " ("
                                                         << dtype_name(pairs[i].first) << ")";
}

TEST(Coalesced, BadArgumentsAreRejectedAtTheCall) {
  const int n = world().size();
  EXPECT_THROW(world().all_reduce_coalesced({}), CommError);
  EXPECT_THROW(world().all_reduce_coalesced({torch::ones({2}), torch::ones({2}, torch::kDouble)}), CommError);
  EXPECT_THROW(world().all_gather_coalesced({torch::ones({2})}, {torch::ones({2 * n + 1})}), CommError);
  EXPECT_THROW(world().all_gather_coalesced({torch::ones({2})}, {}), CommError);
  // The communicator is still usable afterwards.
  auto t = torch::ones({3});
  world().all_reduce(t)->wait();
  EXPECT_TRUE(torch::equal(t, torch::full({3}, static_cast<float>(n))));
}

// ---------------------------------------------------------------------------
// Work handles and argument errors.

TEST(Work, IsCompletedAfterWaitAndWaitIsRepeatable) {
  auto tensor = torch::ones({5});
  auto work = world().all_reduce(tensor);
  work->wait();
  EXPECT_TRUE(work->is_completed());
  EXPECT_NO_THROW(work->wait()) << "a second wait() on a finished operation";
  EXPECT_TRUE(torch::equal(tensor, torch::full({5}, static_cast<float>(world().size()))));
  auto barrier = world().barrier();
  barrier->wait();
  EXPECT_TRUE(barrier->is_completed());
}

// A recv whose message is not sent yet is not completed; it completes once
// the peer sends. The "go" signal travels over a split of the world, which
// has its own thread, while the world's thread is blocked in the recv.
TEST(Work, PendingUntilThePeerSends) {
  const int world_size = world().size();
  const int rank = world().rank();
  auto side = world().split(0, rank);
  ASSERT_NE(side, nullptr);
  if (world_size == 1) GTEST_SKIP() << "needs two ranks";
  auto go = torch::ones({1}, torch::kInt);
  if (rank == 0) {
    auto message = torch::zeros({5}, torch::kLong);
    auto recv = world().recv(message, 1, 11);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(recv->is_completed()) << "a recv completed before its message was sent";
    wait_completed(side->all_reduce(go), "go signal on the side communicator");
    wait_completed(recv, "recv after the go signal");
    EXPECT_TRUE(torch::equal(message, torch::full({5}, 42, torch::kLong))) << message;
  } else {
    wait_completed(side->all_reduce(go), "go signal on the side communicator");
    if (rank == 1) wait_completed(world().send(torch::full({5}, 42, torch::kLong), 0, 11), "send after go");
  }
  EXPECT_EQ(go[0].item<int>(), world_size);
  wait_completed(world().barrier(), "barrier after the pending recv");
}

TEST(Errors, InvalidArgumentsThrowAtTheCall) {
  const int world_size = world().size();
  const int rank = world().rank();
  const auto non_contiguous = torch::zeros({4, 6}).t();
  ASSERT_FALSE(non_contiguous.is_contiguous());
  const auto strided = torch::zeros({20}).slice(0, 0, 20, 2);
  ASSERT_FALSE(strided.is_contiguous());
  const auto full7 = torch::zeros({7});
  const auto good_shard = torch::zeros({dtrain::shard_range(7, world_size, rank).count});
  const auto bad_shard = torch::zeros({dtrain::shard_range(7, world_size, rank).count + 1});
  auto t = torch::zeros({4});

  EXPECT_THROW(world().all_reduce(non_contiguous), CommError) << "non-contiguous all_reduce";
  EXPECT_THROW(world().all_reduce(strided, ReduceOp::Max), CommError) << "strided all_reduce";
  EXPECT_THROW(world().broadcast(non_contiguous, 0), CommError) << "non-contiguous broadcast";
  EXPECT_THROW(world().all_gather(good_shard, torch::zeros({14}).slice(0, 0, 14, 2)), CommError)
      << "non-contiguous all_gather output";
  EXPECT_THROW(world().all_reduce(torch::Tensor()), CommError) << "undefined tensor";
  EXPECT_THROW(world().all_reduce(torch::zeros({4}, torch::kComplexFloat)), CommError) << "complex dtype";

  EXPECT_THROW(world().all_gather(bad_shard, full7), CommError) << "all_gather with a wrong shard size";
  EXPECT_THROW(world().reduce_scatter(full7, bad_shard), CommError) << "reduce_scatter with a wrong shard size";
  EXPECT_THROW(world().all_gather(good_shard.to(torch::kDouble), full7), CommError) << "all_gather dtype mismatch";
  EXPECT_THROW(world().reduce_scatter(full7, good_shard, ReduceOp::Max), CommError) << "reduce_scatter max";
  EXPECT_THROW(world().reduce_scatter(full7.to(torch::kInt), good_shard.to(torch::kInt), ReduceOp::Avg), CommError)
      << "reduce_scatter avg on int32";
  EXPECT_THROW(world().all_reduce(torch::zeros({3}, torch::kLong), ReduceOp::Avg), CommError) << "avg on int64";

  const auto even = torch::zeros({2 * world_size});
  EXPECT_THROW(world().all_to_all(even, torch::zeros({2 * world_size + 1})), CommError) << "all_to_all sizes differ";
  EXPECT_THROW(world().all_to_all(even, torch::zeros({2 * world_size}, torch::kDouble)), CommError)
      << "all_to_all dtypes differ";
  if (world_size > 1) {
    EXPECT_THROW(world().all_to_all(torch::zeros({2 * world_size + 1}), torch::zeros({2 * world_size + 1})), CommError)
        << "all_to_all chunks uneven";
  }
  EXPECT_THROW(world().all_to_all(even, even), CommError) << "all_to_all in place";

  EXPECT_THROW(world().broadcast(t, -1), CommError) << "broadcast root -1";
  EXPECT_THROW(world().broadcast(t, world_size), CommError) << "broadcast root == size";

  EXPECT_THROW(world().send(t, rank), CommError) << "send to self";
  EXPECT_THROW(world().recv(t, rank), CommError) << "recv from self";
  EXPECT_THROW(world().send(t, world_size), CommError) << "send to a rank out of range";
  EXPECT_THROW(world().recv(t, -1), CommError) << "recv from a rank out of range";
  if (world_size > 1) {
    const int peer = (rank + 1) % world_size;
    EXPECT_THROW(world().send(non_contiguous, peer), CommError) << "non-contiguous send";
    EXPECT_THROW(world().send(t, peer, -1), CommError) << "negative tag";
  }

  // Rejected calls queue nothing: the communicator is still usable and the
  // ranks are still in step.
  auto ones = torch::ones({3}, torch::kInt);
  wait_completed(world().all_reduce(ones), "all_reduce after rejected calls");
  EXPECT_TRUE(torch::equal(ones, torch::full({3}, world_size, torch::kInt)));
}

TEST(Errors, TagOutOfRangeThrowsAtTheCall) {
  const int world_size = world().size();
  if (world_size == 1) GTEST_SKIP() << "needs two ranks";
  auto t = torch::zeros({2});
  EXPECT_THROW(world().send(t, (world().rank() + 1) % world_size, dtrain::kMaxTag + 1), CommError);
  EXPECT_THROW(world().recv(t, (world().rank() + 1) % world_size, dtrain::kMaxTag + 1), CommError);
}

// ---------------------------------------------------------------------------
// What engines rely on: in-place flat collectives and autograd leaves.

// FSDP gathers into the buffer that already holds this rank's shard, and
// reduce-scatters a gradient buffer into a view of itself.
TEST(InPlace, AllGatherFromAShardInsideFull) {
  const int world_size = world().size();
  const int rank = world().rank();
  for (int64_t total : {int64_t{7}, int64_t{4096}}) {
    const auto mine = dtrain::shard_range(total, world_size, rank);
    auto expected = torch::arange(total, torch::kFloat) * 0.5f + 1.0f;
    auto full = torch::zeros({total});
    full.narrow(0, mine.offset, mine.count).copy_(expected.narrow(0, mine.offset, mine.count));
    wait_completed(world().all_gather(full.narrow(0, mine.offset, mine.count), full), "in-place all_gather");
    EXPECT_TRUE(torch::equal(full, expected)) << "total " << total;
  }
}

TEST(InPlace, ReduceScatterIntoAViewOfFull) {
  const int world_size = world().size();
  const int rank = world().rank();
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const int64_t total = 4096 + 3;
    const auto mine = dtrain::shard_range(total, world_size, rank);
    auto full = (torch::arange(total, torch::kFloat) + rank).to(dtype);
    auto expected = torch::zeros({total}, torch::kDouble);
    for (int r = 0; r < world_size; ++r) expected += (torch::arange(total, torch::kFloat) + r).to(dtype).to(torch::kDouble);
    expected = expected.narrow(0, mine.offset, mine.count).to(dtype);
    // The shard aliases the start of full, which holds other ranks' pieces' inputs.
    auto shard = full.narrow(0, 0, mine.count);
    wait_completed(world().reduce_scatter(full, shard, ReduceOp::Sum), "in-place reduce_scatter");
    EXPECT_TRUE(torch::equal(shard, expected)) << dtype_name(dtype);
  }
}

// DDP averages gradients and broadcasts parameters that require grad; the
// result must not depend on which thread ran the operation (the background
// thread has grad mode on by default).
TEST(Autograd, LeavesThatRequireGradCanBeReducedInPlace) {
  const int world_size = world().size();
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    auto param = torch::full({5}, 2.0, torch::TensorOptions().dtype(dtype).requires_grad(true));
    auto issued = world().all_reduce(param, ReduceOp::Avg);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // often run by the background thread
    wait_completed(issued, "all_reduce avg of a leaf that requires grad");
    EXPECT_TRUE(torch::equal(param.detach(), torch::full({5}, 2.0, dtype))) << dtype_name(dtype);
    wait_completed(world().broadcast(param, world_size - 1), "broadcast of a leaf that requires grad");
    EXPECT_TRUE(param.requires_grad());
  }
}

// ---------------------------------------------------------------------------
// Point-to-point patterns that are not symmetric.

// Rank 0 receives one message from every other rank, then everyone runs a
// collective: a valid program (rank 0 issues more operations than the others).
TEST(PointToPoint, FanInThenCollective) {
  const int world_size = world().size();
  if (world_size == 1) GTEST_SKIP() << "needs two ranks";
  const int rank = world().rank();
  std::vector<torch::Tensor> got;
  std::vector<dtrain::WorkPtr> works;
  if (rank == 0) {
    for (int r = 1; r < world_size; ++r) {
      got.push_back(torch::zeros({3}, torch::kLong));
      works.push_back(world().recv(got.back(), r, 3));
    }
  } else {
    works.push_back(world().send(torch::full({3}, 10 * rank, torch::kLong), 0, 3));
  }
  auto sum = torch::full({2}, rank + 1, torch::kLong);
  works.push_back(world().all_reduce(sum));
  for (auto& w : works) wait_completed(w, "fan-in");
  for (int r = 1; r < world_size && rank == 0; ++r)
    EXPECT_TRUE(torch::equal(got[r - 1], torch::full({3}, 10 * r, torch::kLong))) << "message from rank " << r;
  EXPECT_TRUE(torch::equal(sum, torch::full({2}, world_size * (world_size + 1) / 2, torch::kLong)));
}

// ---------------------------------------------------------------------------
// split

TEST(Split, GroupsByColorOrderedByKey) {
  const int world_size = world().size();
  const int rank = world().rank();
  const int color = rank % 2;
  auto group = world().split(color, -rank);
  ASSERT_NE(group, nullptr);  // the same on every rank: no collective skipped unevenly
  // Members: the ranks of my parity, ordered by key = -rank (descending rank).
  std::vector<int> members;
  for (int r = world_size - 1; r >= 0; --r)
    if (r % 2 == color) members.push_back(r);
  const int expected_rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  EXPECT_EQ(group->size(), static_cast<int>(members.size()));
  EXPECT_EQ(group->rank(), expected_rank);
  EXPECT_EQ(group->backend_name(), world().backend_name());
  EXPECT_EQ(group->timeout(), world().timeout());

  // The group's order, seen through an all_gather of world ranks.
  auto mine = torch::full({1}, rank, torch::kLong);
  auto order = torch::full({group->size()}, -1, torch::kLong);
  wait_completed(group->all_gather(mine, order), "all_gather in the group");
  EXPECT_TRUE(torch::equal(order, torch::tensor(std::vector<int64_t>(members.begin(), members.end()))))
      << "group order: " << order;

  // Interleave world and group operations without waiting in between.
  int64_t group_sum = 0;
  for (int r : members) group_sum += 1000 + r;
  const int64_t world_sum = static_cast<int64_t>(world_size) * (world_size - 1) / 2;
  std::vector<torch::Tensor> world_tensors, group_tensors;
  std::vector<dtrain::WorkPtr> works;
  for (int i = 0; i < 6; ++i) {
    world_tensors.push_back(torch::full({1000 + i}, rank, torch::kLong));
    works.push_back(world().all_reduce(world_tensors.back()));
    group_tensors.push_back(torch::full({1000 + i}, 1000 + rank, torch::kLong));
    works.push_back(group->all_reduce(group_tensors.back()));
  }
  auto bcast = torch::full({3}, rank, torch::kLong);
  works.push_back(group->broadcast(bcast, 0));
  for (auto& w : works) wait_completed(w, "interleaved world/group all_reduce");
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(torch::equal(world_tensors[i], torch::full({1000 + i}, world_sum, torch::kLong)))
        << "world all_reduce " << i << " disturbed by the group: " << world_tensors[i][0].item<int64_t>()
        << ", expected " << world_sum;
    EXPECT_TRUE(torch::equal(group_tensors[i], torch::full({1000 + i}, group_sum, torch::kLong)))
        << "group all_reduce " << i << " is not over the group only: " << group_tensors[i][0].item<int64_t>()
        << ", expected " << group_sum;
  }
  EXPECT_TRUE(torch::equal(bcast, torch::full({3}, members[0], torch::kLong)))
      << "group broadcast from group rank 0 (world rank " << members[0] << ")";

  // Float reductions and uneven shards inside the group.
  const int salt = 77;
  const int64_t count = 1001;
  const auto range = dtrain::shard_range(count, group->size(), group->rank());
  auto full = input(torch::kFloat, group->rank(), 0, count, salt);
  auto shard = sentinel_filled(range.count, torch::kFloat);
  wait_completed(group->reduce_scatter(full, shard, ReduceOp::Avg), "reduce_scatter in the group");
  EXPECT_TRUE(matches(shard, reference(ReduceOp::Avg, torch::kFloat, group->size(), range.offset, range.count, salt),
                      torch::kFloat, false, "group reduce_scatter avg"));

  // A split of the group is a communicator too.
  auto copy = group->split(0, group->rank());
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->size(), group->size());
  EXPECT_EQ(copy->rank(), group->rank());
  auto one = torch::ones({4}, torch::kInt);
  wait_completed(copy->all_reduce(one), "all_reduce in a split of the group");
  EXPECT_TRUE(torch::equal(one, torch::full({4}, group->size(), torch::kInt)));

  // And the world still works afterwards.
  auto check = torch::ones({2}, torch::kLong);
  wait_completed(world().all_reduce(check), "world all_reduce after split");
  EXPECT_TRUE(torch::equal(check, torch::full({2}, world_size, torch::kLong)));
}

TEST(Split, NegativeColorGivesNullptr) {
  const int world_size = world().size();
  const int rank = world().rank();
  const bool excluded = rank == world_size - 1;  // the only rank when world == 1
  auto group = world().split(excluded ? -1 : 5, rank);
  if (excluded) {
    EXPECT_EQ(group, nullptr) << "rank " << rank << " passed color -1";
  } else {
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->size(), world_size - 1);
    EXPECT_EQ(group->rank(), rank);
    auto t = torch::full({3}, rank + 1, torch::kLong);
    wait_completed(group->all_reduce(t), "all_reduce in the group without the last rank");
    const int64_t expected = static_cast<int64_t>(world_size - 1) * world_size / 2;
    EXPECT_TRUE(torch::equal(t, torch::full({3}, expected, torch::kLong)))
        << "got " << t[0].item<int64_t>() << ", expected " << expected;
  }
  auto t = torch::ones({1}, torch::kLong);
  wait_completed(world().all_reduce(t), "world all_reduce after a split with color -1");
  EXPECT_EQ(t[0].item<int64_t>(), world_size);
}

}  // namespace

int main(int argc, char** argv) { return dtrain::testing::run_multirank_tests(argc, argv); }
