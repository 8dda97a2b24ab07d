// tests/plan: what the runs measured against dtrain plan share.
#pragma once

#include <dtrain/ddp.h>
#include <dtrain/fsdp.h>
#include <dtrain/plan.h>

#include "../common/multirank_gtest.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace dtrain::testing {

// A measured step peak against the plan's, printed (the ratios
// docs/PERFORMANCE.md quotes) and within 5%.
inline void expect_planned_peak(int64_t measured, const plan::Plan& planned, const std::string& where) {
  const double ratio = static_cast<double>(measured) / static_cast<double>(planned.peak.total());
  std::printf("  rank %d, %s: measured %lld bytes, planned %lld (%.4f) at %s\n", world().rank(), where.c_str(),
              static_cast<long long>(measured), static_cast<long long>(planned.peak.total()), ratio,
              planned.peak_moment.c_str());
  EXPECT_NEAR(ratio, 1.0, 0.05) << where << ": measured " << measured << " bytes, planned " << planned.peak.total()
                                << " at " << planned.peak_moment;
}

// `module_forward` on `x` through the engine, as dtrain train calls it: DDP
// (ddp set) before its forward, or FSDP's root forward on its compute input.
inline torch::Tensor engine_forward(DistributedDataParallelBase* ddp, FullyShardedBase* fsdp,
                                    const std::function<torch::Tensor(const torch::Tensor&)>& module_forward,
                                    const torch::Tensor& x) {
  if (ddp) {
    ddp->before_forward();
    return module_forward(x);
  }
  return fsdp->forward_root([&] { return module_forward(fsdp->compute_input(x)); });
}

}  // namespace dtrain::testing
