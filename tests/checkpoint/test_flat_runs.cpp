// FlatRun arithmetic (include/dtrain/flat_runs.h), which tensor-parallel
// checkpoints rest on: the runs of a slice equal LibTorch's indexing of the
// same slice, and a sub-range of runs equals that range of their elements,
// for many random shapes, slices and ranges.
#include <dtrain/flat_runs.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>
#include <stdexcept>
#include <vector>

namespace {

using dtrain::FlatRun;

std::vector<int64_t> elements_of(const std::vector<FlatRun>& runs) {
  std::vector<int64_t> out;
  dtrain::for_each_range(runs, [&](int64_t begin, int64_t end, int64_t position) {
    EXPECT_EQ(position, static_cast<int64_t>(out.size()));
    for (int64_t i = begin; i < end; ++i) out.push_back(i);
  });
  return out;
}

std::vector<int64_t> as_vector(const torch::Tensor& t) {
  auto c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

TEST(FlatRuns, RunsOfASliceAreTheSliceLibTorchIndexes) {
  std::mt19937 random(7);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(random); };
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<int64_t> shape(static_cast<size_t>(pick(1, 4)));
    for (auto& d : shape) d = pick(1, 5);
    const int dim = static_cast<int>(pick(0, static_cast<int64_t>(shape.size()) - 1));
    const int64_t start = pick(0, shape[dim] - 1), size = pick(0, shape[dim] - start);
    const auto runs = dtrain::runs_of_slice(shape, dim, start, size);
    int64_t numel = 1;
    for (auto d : shape) numel *= d;
    const auto expected = as_vector(torch::arange(numel).view(shape).narrow(dim, start, size).flatten());
    ASSERT_EQ(elements_of(runs), expected) << "shape " << c10::IntArrayRef(shape) << " dim " << dim << " [" << start
                                           << ", " << start + size << ")";
    EXPECT_LE(runs.size(), 1u) << "one (strided) run per slice";
    EXPECT_EQ(dtrain::numel_of(runs), static_cast<int64_t>(expected.size()));
  }
}

TEST(FlatRuns, SubRunsAreThatRangeOfTheElements) {
  std::mt19937 random(11);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(random); };
  for (int trial = 0; trial < 500; ++trial) {
    // A column-parallel qkv slice (3 sections) or a row-parallel one, as tp ranks hold them.
    const int64_t rows = pick(1, 6), columns = pick(1, 6), sections = pick(1, 3);
    const auto runs = trial % 2 ? dtrain::runs_of_slice({sections, rows, columns}, 1, pick(0, rows - 1), 1)
                                : dtrain::runs_of_slice({rows * sections, columns}, 1, 0, pick(1, columns));
    const auto all = elements_of(runs);
    const int64_t from = pick(0, static_cast<int64_t>(all.size())), to = pick(from, static_cast<int64_t>(all.size()));
    const auto part = dtrain::sub_runs(runs, from, to);
    ASSERT_EQ(elements_of(part), std::vector<int64_t>(all.begin() + from, all.begin() + to));
    EXPECT_LE(part.size(), 3u * runs.size()) << "a partial run, whole runs, a partial run";
  }
  // The whole of a contiguous range stays one run.
  EXPECT_EQ(dtrain::sub_runs({{10, 8, 0, 1}}, 2, 6), (std::vector<FlatRun>{{12, 4, 0, 1}}));
  // Whole columns of rows that touch are one contiguous run.
  EXPECT_EQ(dtrain::runs_of_slice({4, 3}, 1, 0, 3), (std::vector<FlatRun>{{0, 12, 0, 1}}));
}

TEST(FlatRuns, RangesOutsideAreRejected) {
  EXPECT_THROW(dtrain::runs_of_slice({4, 3}, 2, 0, 1), std::invalid_argument);
  EXPECT_THROW(dtrain::runs_of_slice({4, 3}, 1, 2, 2), std::invalid_argument);
  EXPECT_THROW(dtrain::sub_runs({{0, 4, 0, 1}}, 3, 5), std::invalid_argument);
  EXPECT_THROW(dtrain::sub_runs({{0, 4, 0, 1}}, 3, 2), std::invalid_argument);
}

}  // namespace
