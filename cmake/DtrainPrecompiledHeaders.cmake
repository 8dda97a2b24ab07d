# Precompiled headers: LibTorch's and GoogleTest's headers, parsed once per
# build instead of once per translation unit (issue 14). Nearly every file of
# dtrain -- library, CLI, examples, tests -- includes LibTorch, whose header
# tree takes most of a translation unit's compile time; with the header
# precompiled a typical file compiles in about half the time.
#
# One precompiled header (target dtrain_pch) is built, and every C++ target
# of the project reuses it (REUSE_FROM). GCC accepts a precompiled header only
# when it was built with the same code-generation flags, so all targets
# compile with -fPIC (CMakeLists.txt) and the same macros (LibTorch's, which
# every target gets through dtrain::torch); CMake adds -Winvalid-pch, so a
# mismatch would show as a warning rather than a silently slower build.
#
# -DDTRAIN_PCH=OFF turns it off, for whoever checks that each file includes
# what it uses (with the header precompiled, every file sees torch/torch.h).
option(DTRAIN_PCH "Precompile LibTorch's and GoogleTest's headers" ON)

# The headers worth precompiling: included (directly or through dtrain's own
# headers) by most translation units.
set(DTRAIN_PCH_HEADERS
  <torch/torch.h>
  <algorithm> <atomic> <chrono> <cstdint> <functional> <map> <memory> <mutex>
  <optional> <sstream> <stdexcept> <string> <thread> <unordered_map> <utility> <vector>)

# dtrain_precompile_headers(): call once, after every target is defined.
# Makes dtrain_pch and has every C++ executable and library of the project
# (found by walking the source tree's directories) reuse it.
function(dtrain_precompile_headers)
  if(NOT DTRAIN_PCH)
    return()
  endif()
  _dtrain_compiled_targets_below(${PROJECT_SOURCE_DIR} targets)
  add_library(dtrain_pch OBJECT ${PROJECT_SOURCE_DIR}/cmake/dtrain_pch.cpp)
  target_link_libraries(dtrain_pch PRIVATE dtrain::torch dtrain_warnings)
  set(headers ${DTRAIN_PCH_HEADERS})
  if(DTRAIN_BUILD_TESTS)
    # The tests' scaffolding: parsed once, not once per test file.
    # GoogleTest's targets define GTEST_HAS_PTHREAD=1 for the tests; every
    # target defines it alike (the value gtest-port.h picks on Linux anyway),
    # since GCC rejects a precompiled header used under other macros.
    find_package(GTest REQUIRED)
    target_link_libraries(dtrain_pch PRIVATE GTest::gtest)
    list(APPEND headers <gtest/gtest.h>)
    foreach(target IN LISTS targets)
      target_compile_definitions(${target} PRIVATE GTEST_HAS_PTHREAD=1)
    endforeach()
  endif()
  target_precompile_headers(dtrain_pch PRIVATE ${headers})

  foreach(target IN LISTS targets)
    target_precompile_headers(${target} REUSE_FROM dtrain_pch)
  endforeach()
endfunction()

# The executables and libraries that compile C++, in DIR and below.
function(_dtrain_compiled_targets_below dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  set(found "")
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY)$")
      list(APPEND found ${target})
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(subdir IN LISTS subdirs)
    _dtrain_compiled_targets_below(${subdir} below)
    list(APPEND found ${below})
  endforeach()
  set(${out} ${found} PARENT_SCOPE)
endfunction()
