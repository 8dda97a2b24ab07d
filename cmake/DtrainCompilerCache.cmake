# ccache, when installed (scripts/setup installs it): a second clean build --
# another clone, CI's fresh checkout, `make clean` -- reuses the first one's
# compiled objects instead of compiling them again (issue 14).
#
# The settings make the cache work across clones and with the precompiled
# header: paths under the clone's parent folder are hashed relative to it (so
# /work/a/dtrain and /tmp/b/dtrain share entries), the build folder's own path
# is not hashed, and the precompiled header's macros and timestamps are
# accepted as ccache documents for precompiled headers.
#
# Depend mode (CCACHE_DEPEND=1): on a miss ccache compiles once and takes the
# file list from the compiler's own -MD output, instead of first running the
# preprocessor over LibTorch's headers to hash its output; hits are found the
# same way as before (direct mode). Even so, an empty cache costs a clean
# build time: 725 s with it against 643 s with ccache off, on 2 cores
# (2026-12-05, docs/PERFORMANCE.md "Build and test time"). The unity sources
# name their files by absolute path, so a clone at another path misses.
# -DDTRAIN_CCACHE=OFF turns it off (e.g. to time a build without it).
option(DTRAIN_CCACHE "Compile through ccache when it is installed" ON)
find_program(DTRAIN_CCACHE_PROGRAM ccache)
if(DTRAIN_CCACHE AND DTRAIN_CCACHE_PROGRAM AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  get_filename_component(_dtrain_clone_parent "${PROJECT_SOURCE_DIR}/.." ABSOLUTE)
  set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env
      "CCACHE_BASEDIR=${_dtrain_clone_parent}"
      CCACHE_NOHASHDIR=1
      CCACHE_DEPEND=1
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      ${DTRAIN_CCACHE_PROGRAM})
  message(STATUS "dtrain: compiling through ${DTRAIN_CCACHE_PROGRAM} (-DDTRAIN_CCACHE=OFF to turn it off)")
endif()
