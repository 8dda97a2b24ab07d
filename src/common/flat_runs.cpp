#include <dtrain/flat_runs.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dtrain {
namespace {

// Appends `run` (normalised: a strided run whose runs touch is one
// contiguous run), merging it into the last one where it continues it.
void append(std::vector<FlatRun>& out, FlatRun run) {
  if (run.length == 0 || run.count == 0) return;
  if (run.count == 1) run.stride = 0;
  if (run.count > 1 && run.stride == run.length) {
    run.length *= run.count;
    run.count = 1;
    run.stride = 0;
  }
  if (!out.empty()) {
    FlatRun& last = out.back();
    // Two contiguous ranges, end to start.
    if (last.count == 1 && run.count == 1 && last.begin + last.length == run.begin) {
      last.length += run.length;
      return;
    }
    // One more run of a strided family (or a second run making one).
    const int64_t next = last.begin + last.count * (last.count > 1 ? last.stride : 0);
    if (run.count == 1 && last.length == run.length && last.count > 1 && next == run.begin) {
      ++last.count;
      return;
    }
  }
  out.push_back(run);
}

}  // namespace

std::vector<FlatRun> runs_of_slice(const std::vector<int64_t>& shape, int dim, int64_t start, int64_t size) {
  if (dim < 0 || dim >= static_cast<int>(shape.size()) || start < 0 || size < 0 || start + size > shape[dim]) {
    throw std::invalid_argument("runs_of_slice: [" + std::to_string(start) + ", " + std::to_string(start + size) +
                                ") along dimension " + std::to_string(dim) + " is outside the shape");
  }
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[d];
  for (size_t d = static_cast<size_t>(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  std::vector<FlatRun> out;
  append(out, {start * inner, size * inner, shape[dim] * inner, outer});
  return out;
}

std::vector<FlatRun> sub_runs(const std::vector<FlatRun>& runs, int64_t from, int64_t to) {
  const int64_t total = numel_of(runs);
  if (from < 0 || to < from || to > total) {
    throw std::invalid_argument("sub_runs: [" + std::to_string(from) + ", " + std::to_string(to) +
                                ") is not inside a sequence of " + std::to_string(total) + " elements");
  }
  std::vector<FlatRun> out;
  int64_t position = 0;  // of `run`'s first element in the sequence
  for (const FlatRun& run : runs) {
    const int64_t lo = std::max(from, position) - position, hi = std::min(to, position + run.numel()) - position;
    position += run.numel();
    if (lo >= hi) continue;
    const int64_t first_k = lo / run.length, last_k = (hi - 1) / run.length;
    auto start_of = [&](int64_t k) { return run.begin + k * run.stride; };
    if (first_k == last_k) {  // inside one run
      append(out, {start_of(first_k) + lo % run.length, hi - lo, 0, 1});
      continue;
    }
    int64_t k = first_k;
    if (lo % run.length != 0) {  // the rest of a partial first run
      append(out, {start_of(k) + lo % run.length, run.length - lo % run.length, 0, 1});
      ++k;
    }
    const int64_t whole_end = hi % run.length == 0 ? last_k + 1 : last_k;  // runs k .. whole_end - 1 whole
    if (whole_end > k) append(out, {start_of(k), run.length, run.stride, whole_end - k});
    if (hi % run.length != 0) append(out, {start_of(last_k), hi % run.length, 0, 1});
  }
  return out;
}

int64_t numel_of(const std::vector<FlatRun>& runs) {
  int64_t total = 0;
  for (const FlatRun& run : runs) total += run.numel();
  return total;
}

}  // namespace dtrain
