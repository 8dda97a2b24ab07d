// tests/plan: a measured step peak against dtrain plan's, printed (the
// ratios docs/PERFORMANCE.md quotes) and within 5%.
#pragma once

#include <dtrain/plan.h>

#include "../common/multirank_gtest.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace dtrain::testing {

inline void expect_planned_peak(int64_t measured, const plan::Plan& planned, const std::string& where) {
  const double ratio = static_cast<double>(measured) / static_cast<double>(planned.peak.total());
  std::printf("  rank %d, %s: measured %lld bytes, planned %lld (%.4f) at %s\n", world().rank(), where.c_str(),
              static_cast<long long>(measured), static_cast<long long>(planned.peak.total()), ratio,
              planned.peak_moment.c_str());
  EXPECT_NEAR(ratio, 1.0, 0.05) << where << ": measured " << measured << " bytes, planned " << planned.peak.total()
                                << " at " << planned.peak_moment;
}

}  // namespace dtrain::testing
