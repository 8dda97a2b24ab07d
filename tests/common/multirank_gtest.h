// gtest for multi-rank test programs: every rank runs every test in the same
// order (so every rank issues the same collectives); rank 0 prints the usual
// report, other ranks print only their failures, prefixed "[rank N]"; all
// ranks exit with the same verdict.
//
// Rules for tests: checks use EXPECT_* (never ASSERT_* between two
// collectives), so a failed check never makes one rank skip a collective.
#pragma once

#include <dtrain/comm.h>

#include <string>

namespace dtrain::testing {

// The world communicator, valid while run_multirank_tests runs.
Communicator& world();
const CommPtr& world_ptr();

// A temporary folder's path that every rank names alike (rank 0's pid in
// it): collective over the world. Not created.
std::string shared_temp_folder(const std::string& what);

// Initialises gtest and dtrain (which removes --backend from argv), runs all
// tests, agrees on the verdict across ranks. Returns main's exit code.
int run_multirank_tests(int argc, char** argv);

}  // namespace dtrain::testing
