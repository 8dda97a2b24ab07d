// What the step replays (simulate_step.cpp, simulate_pipeline_step.cpp)
// share: a timeline of bytes by category with its peak, and DDP's bucket
// fill.
#pragma once

#include "plan/plan_internal.h"

#include <dtrain/ddp.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::plan::detail {

using Field = int64_t MemoryBreakdown::*;

class Timeline {
 public:
  void add(Field field, int64_t bytes) { now_.*field += bytes; }
  void remove(Field field, int64_t bytes) {
    now_.*field -= bytes;
    if (now_.*field < 0) throw std::logic_error("plan: negative bytes in the memory replay (a bug in dtrain plan)");
  }
  // A candidate for the peak.
  void mark(const std::string& moment) {
    if (now_.total() > peak_.total() || peak_moment_.empty()) {
      peak_ = now_;
      peak_moment_ = moment;
    }
  }
  // A transient that lives only at this moment.
  void mark_with(Field field, int64_t bytes, const std::string& moment) {
    add(field, bytes);
    mark(moment);
    remove(field, bytes);
  }
  const MemoryBreakdown& now() const { return now_; }
  const MemoryBreakdown& peak() const { return peak_; }
  const std::string& peak_moment() const { return peak_moment_; }

 private:
  MemoryBreakdown now_, peak_;
  std::string peak_moment_;
};

inline std::string display(const UnitSpec& unit) { return unit.name.empty() ? "the root" : "'" + unit.name + "'"; }

inline int64_t optimizer_temporary_bytes(const Layout& layout, int64_t largest_piece) {
  return layout.optimizer_states == 2 ? 2 * largest_piece * 4 : 0;  // AdamW's sqrt and its quotient
}

// Fresh gradients waiting for their bucket to complete, in arrival order,
// closed by the caps exactly as src/ddp/bucket_assignment.cpp closes them.
class DDPBucketFill {
 public:
  // A gradient of `bytes` arrives; returns the bytes its bucket's completion
  // frees (0 while the bucket is open).
  int64_t arrive(int64_t bytes) {
    int64_t freed = 0;
    if (open_ > 0 && open_ + bytes > cap()) freed += close();
    open_ += bytes;
    if (open_ >= cap()) freed += close();
    return freed;
  }
  // The end of backward completes the last bucket.
  int64_t finish() { return open_ > 0 ? close() : 0; }

 private:
  int64_t cap() const { return first_ ? defaults_.first_bucket_cap_bytes : defaults_.bucket_cap_bytes; }
  int64_t close() {
    const int64_t freed = open_;
    open_ = 0;
    first_ = false;
    return freed;
  }
  const DDPOptions defaults_;
  int64_t open_ = 0;
  bool first_ = true;
};

// The bytes of each of DDP's buckets for `model`: every parameter's fp32
// gradient, last to first, filled as DDPBucketFill fills them.
inline std::vector<int64_t> ddp_bucket_bytes(const ModelSpec& model) {
  std::vector<int64_t> buckets;
  DDPBucketFill fill;
  for (auto unit = model.units.rbegin(); unit != model.units.rend(); ++unit)
    for (auto p = unit->parameters.rbegin(); p != unit->parameters.rend(); ++p)
      if (const int64_t closed = fill.arrive(p->numel * 4); closed > 0) buckets.push_back(closed);
  if (const int64_t last = fill.finish(); last > 0) buckets.push_back(last);
  return buckets;
}

}  // namespace dtrain::plan::detail
