# Unity build (issue 37): each target's sources compile in batches of eight,
# one translation unit per batch, instead of one per file.
#
# Why: with the precompiled header, even an empty file costs about 6 s of CPU
# on this project's machines (loading the 750 MB header and the template
# instantiations GCC defers to the end of every translation unit), and a
# typical library file only 1-2 s more. Paying that once per batch instead of
# once per file took the library from 1,056 s of compile CPU to 367 s, and a
# clean build from 16 to about 10 minutes on 2 cores (docs/PERFORMANCE.md,
# "Build time"). Editing one file recompiles its batch (about 20 s), still
# well under the minute an edit-build-test loop should take.
#
# Note [unity build]: the files of one target share a translation unit with
# their batch mates, so names at namespace scope -- in anonymous namespaces
# and static ones included -- must be unique within the target, not only
# within the file. Which files share a batch changes as files are added, so a
# clash shows as a "redefinition" error in a file nobody touched: give the
# helper a more specific name, or move a helper two files need into a header
# of their own (as src/plan/plan_internal.h and apps/dtrain/json_file.h do).
# A `using namespace` at file scope reaches the batch's later files too: the
# library and the CLI have none; a test program of one file may.
#
# -DDTRAIN_UNITY=OFF compiles each file alone (with -DDTRAIN_PCH=OFF too, it
# checks that each file includes what it uses).
option(DTRAIN_UNITY "Compile each target's sources in batches (unity build)" ON)
if(DTRAIN_UNITY)
  set(CMAKE_UNITY_BUILD ON)
  set(CMAKE_UNITY_BUILD_BATCH_SIZE 8)
endif()
