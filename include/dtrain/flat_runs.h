// Which elements of a flattened (row-major) tensor a rank holds when they are
// not one contiguous range. A tensor-parallel rank holds a slice of a global
// weight: the columns [c, c + w) of an [R, C] weight are R runs of w
// elements, C apart; the rows of each of a fused qkv's three sections are
// three runs. FSDP then shards that slice flat, which cuts its runs. Sharded
// checkpoints describe what each rank file holds this way (pieces with a
// stride, dtrain/checkpoint_manifest.h), so that a checkpoint saved on one
// (dp, tp) mesh loads on any other. No LibTorch here: the manifest parser,
// which the fuzzer builds alone, shares these definitions.
#pragma once

#include <cstdint>
#include <vector>

namespace dtrain {

// `count` runs of `length` consecutive elements; run k starts at
// begin + k * stride (stride >= length when count > 1; 0 when count == 1).
struct FlatRun {
  int64_t begin = 0;
  int64_t length = 0;
  int64_t stride = 0;
  int64_t count = 1;
  int64_t numel() const { return length * count; }
  bool operator==(const FlatRun&) const = default;
};

// Where a local tensor's elements (flattened, in order) sit in a larger
// global tensor: the global shape, and the runs they occupy, in order.
struct PlaceInGlobal {
  std::vector<int64_t> global_shape;
  std::vector<FlatRun> runs;
};

// The elements of the slice [start, start + size) along dimension `dim` of a
// row-major tensor of `shape`, in the slice's own row-major order: one run
// per index of the dimensions before `dim` (one strided FlatRun), or one
// contiguous run when they are all 1. Throws std::invalid_argument for a
// slice outside the shape.
std::vector<FlatRun> runs_of_slice(const std::vector<int64_t>& shape, int dim, int64_t start, int64_t size);

// Elements [from, to) of the sequence that `runs` lists in order, as runs
// (each cut run becomes at most three: a partial run, whole runs, a partial
// run); neighbours that continue each other are merged. Throws
// std::invalid_argument when [from, to) is not inside the sequence.
std::vector<FlatRun> sub_runs(const std::vector<FlatRun>& runs, int64_t from, int64_t to);

// The total element count of `runs`.
int64_t numel_of(const std::vector<FlatRun>& runs);

// Calls visit(begin, end, position) for each contiguous range of `runs`, in
// order; `position` is the range's first element's index in the sequence.
template <class Visit>
void for_each_range(const std::vector<FlatRun>& runs, Visit&& visit) {
  int64_t position = 0;
  for (const FlatRun& run : runs) {
    for (int64_t k = 0; k < run.count; ++k) {
      const int64_t first = run.begin + k * run.stride;
      visit(first, first + run.length, position);
      position += run.length;
    }
  }
}

}  // namespace dtrain
