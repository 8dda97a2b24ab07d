// Honest ctest outcomes for test programs whose every case can skip (the CUDA
// tests on a machine without a GPU): GoogleTest exits 0 when all its tests
// were skipped, which ctest would report as "Passed".
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

namespace dtrain::testing {

// What ctest's SKIP_RETURN_CODE is set to for such programs.
inline constexpr int kSkipExitCode = 77;

// main()'s exit code after RUN_ALL_TESTS(): kSkipExitCode when nothing failed
// and every test that ran was skipped, else `code` unchanged.
inline int skip_exit_code_if_all_skipped(int code) {
  const auto& unit = *::testing::UnitTest::GetInstance();
  if (code == 0 && unit.failed_test_count() == 0 && unit.successful_test_count() == 0 &&
      unit.skipped_test_count() > 0) {
    std::printf("SKIP: all %d tests were skipped (their reasons are above)\n", unit.skipped_test_count());
    return kSkipExitCode;
  }
  return code;
}

}  // namespace dtrain::testing
