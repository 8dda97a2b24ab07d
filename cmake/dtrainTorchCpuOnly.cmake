# LibTorch's CPU libraries, for a machine without the CUDA toolkit
# (DtrainDependencies.cmake says why). Sets TORCH_INSTALL_PREFIX,
# TORCH_LIBRARIES (one imported target, dtrain_torch_cpu_only) and
# TORCH_CXX_FLAGS, as find_package(Torch) would, without running LibTorch's
# package config. Included by dtrain's build and by its installed package
# config (a consumer of a CPU-only dtrain links the same way).
#
# The wheel's layout is found from its TorchConfig.cmake, located the way
# find_package(Torch) locates it: Torch_DIR, or CMAKE_PREFIX_PATH (the
# Makefile passes torch.utils.cmake_prefix_path).
if(TARGET dtrain_torch_cpu_only)
  return()
endif()

find_file(DTRAIN_TORCH_CONFIG_FILE TorchConfig.cmake
  PATHS ${Torch_DIR} ENV Torch_DIR ${CMAKE_PREFIX_PATH} ENV CMAKE_PREFIX_PATH
  PATH_SUFFIXES Torch share/cmake/Torch
  NO_DEFAULT_PATH)
if(NOT DTRAIN_TORCH_CONFIG_FILE)
  message(FATAL_ERROR "dtrain: cannot find LibTorch (TorchConfig.cmake). Run scripts/setup (or `make`), "
                      "or pass -DCMAKE_PREFIX_PATH=\"$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')\".")
endif()
get_filename_component(TORCH_INSTALL_PREFIX "${DTRAIN_TORCH_CONFIG_FILE}/../../../.." ABSOLUTE)

set(_dtrain_torch_lib "${TORCH_INSTALL_PREFIX}/lib")
foreach(_library torch_cpu c10)
  if(NOT EXISTS "${_dtrain_torch_lib}/lib${_library}.so")
    message(FATAL_ERROR "dtrain: ${_dtrain_torch_lib}/lib${_library}.so is missing: "
                        "the LibTorch install at ${TORCH_INSTALL_PREFIX} is incomplete; rerun scripts/setup.")
  endif()
endforeach()

add_library(dtrain_torch_cpu_only SHARED IMPORTED GLOBAL)
set_target_properties(dtrain_torch_cpu_only PROPERTIES
  IMPORTED_LOCATION "${_dtrain_torch_lib}/libtorch_cpu.so"
  INTERFACE_INCLUDE_DIRECTORIES "${TORCH_INSTALL_PREFIX}/include;${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include"
  # What LibTorch's own torch_cpu target passes to every consumer.
  INTERFACE_COMPILE_DEFINITIONS "USE_DISTRIBUTED;USE_C10D_GLOO;USE_RPC;USE_TENSORPIPE"
  INTERFACE_COMPILE_FEATURES cxx_std_20
  INTERFACE_LINK_LIBRARIES "${_dtrain_torch_lib}/libc10.so")
set(TORCH_LIBRARIES dtrain_torch_cpu_only)
set(TORCH_CXX_FLAGS "")
