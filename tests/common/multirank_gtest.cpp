#include "multirank_gtest.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>

namespace dtrain::testing {
namespace {

CommPtr g_world;

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::ostringstream out;
    out << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?") << ":"
        << result.line_number() << ": Failure\n";
    std::istringstream lines(result.message());
    for (std::string line; std::getline(lines, line);) out << "[rank " << rank_ << "]   " << line << "\n";
    std::cerr << out.str() << std::flush;
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::ostringstream out;
    out << "[rank " << rank_ << "] FAILED " << info.test_suite_name() << "." << info.name() << "\n";
    std::cerr << out.str() << std::flush;
  }

 private:
  int rank_;
};

}  // namespace

Communicator& world() { return *g_world; }

std::string shared_temp_folder(const std::string& what) {
  auto pid = torch::tensor({world().rank() == 0 ? static_cast<int64_t>(::getpid()) : int64_t{0}});
  world().blocking().all_reduce(pid, ReduceOp::Sum);
  return (std::filesystem::temp_directory_path() / ("dtrain-" + what + "-" + std::to_string(pid.item<int64_t>()))).string();
}
const CommPtr& world_ptr() { return g_world; }

int run_multirank_tests(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  g_world = init(argc, argv);
  const int rank = g_world->rank();
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(rank));

  const int local_result = RUN_ALL_TESTS();

  // Every rank leaves with the same verdict, and only after all finished.
  int any_failed = local_result != 0 ? 1 : 0;
  try {
    auto flag = torch::full({1}, any_failed, torch::kInt);
    g_world->all_reduce(flag, ReduceOp::Max)->wait();
    any_failed = flag[0].item<int>();
  } catch (const std::exception& error) {
    std::cerr << "[rank " << rank << "] could not agree on the verdict: " << error.what() << std::endl;
    any_failed = 1;
  }
  if (any_failed && local_result == 0 && rank == 0)
    std::cerr << "[rank 0] tests failed on another rank (see the [rank N] lines above)" << std::endl;
  g_world.reset();
  return any_failed ? 1 : 0;
}

}  // namespace dtrain::testing
