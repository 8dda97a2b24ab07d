# Finds dtrain's dependencies and prepares LibTorch for linking.
# Also used by dtrainConfig.cmake for projects that consume dtrain.
find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(ZLIB REQUIRED)  # gzipped datasets (src/data)
include(${CMAKE_CURRENT_LIST_DIR}/dtrainTorchArch.cmake)

# DTRAIN_CUDA: AUTO (default) uses LibTorch's CUDA build when the CUDA toolkit
# is installed, and its CPU libraries alone when it is not; ON requires the
# toolkit; OFF never uses it.
#
# Why not always find_package(Torch)? The PyPI wheel is a CUDA build, and
# LibTorch's package config (Caffe2Config.cmake) stops with "Your installed
# Caffe2 version uses CUDA but I cannot find the CUDA libraries" on a machine
# without the toolkit -- a newcomer's plain Debian machine. The wheel's CPU
# libraries (libtorch_cpu, libc10) need no toolkit: the CUDA runtime pieces
# they load come with the wheel's nvidia-* dependencies and are found through
# their own RPATH. So without a toolkit dtrain links those two through a
# target of its own (dtrainTorchCpuOnly.cmake) and leaves out its NCCL path.
set(DTRAIN_CUDA AUTO CACHE STRING "Use LibTorch's CUDA build: AUTO (when the CUDA toolkit is found), ON or OFF")
set_property(CACHE DTRAIN_CUDA PROPERTY STRINGS AUTO ON OFF)
if(DTRAIN_CUDA STREQUAL "AUTO")
  find_package(CUDAToolkit QUIET)
  set(_dtrain_use_cuda_toolkit ${CUDAToolkit_FOUND})
elseif(DTRAIN_CUDA)
  set(_dtrain_use_cuda_toolkit ON)
else()
  set(_dtrain_use_cuda_toolkit OFF)
endif()

if(_dtrain_use_cuda_toolkit)
  find_package(Torch REQUIRED)
  # The PyPI wheel's LibTorch links CUDA libraries that live in sibling
  # nvidia/*/lib folders of the wheel; the linker must look there before any
  # system CUDA toolkit (whose NCCL or nvrtc may be older than LibTorch's).
  file(GLOB DTRAIN_TORCH_NVIDIA_LIB_DIRS LIST_DIRECTORIES true "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
  # LibTorch's CMake adds the toolkit's libnvrtc by path; LibTorch itself brings its own.
  list(FILTER TORCH_LIBRARIES EXCLUDE REGEX "libnvrtc")
  if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
    set(DTRAIN_WITH_CUDA ON)
  else()
    set(DTRAIN_WITH_CUDA OFF)
  endif()
else()
  include(${CMAKE_CURRENT_LIST_DIR}/dtrainTorchCpuOnly.cmake)
  set(DTRAIN_WITH_CUDA OFF)
  # On every configure: `make build` shows this line (it greps "-- dtrain:").
  message(STATUS "dtrain: CUDA toolkit not used (DTRAIN_CUDA=${DTRAIN_CUDA}): building the CPU path against "
                 "LibTorch's CPU libraries; the NCCL path is left out")
endif()

if(NOT TARGET dtrain::torch)
  add_library(dtrain_torch INTERFACE)
  add_library(dtrain::torch ALIAS dtrain_torch)
  target_link_libraries(dtrain_torch INTERFACE ${TORCH_LIBRARIES})
  target_compile_options(dtrain_torch INTERFACE ${TORCH_CXX_FLAGS})
  if(DTRAIN_TORCH_NVIDIA_LIB_DIRS)
    list(JOIN DTRAIN_TORCH_NVIDIA_LIB_DIRS ":" _dtrain_nv_path)
    target_link_options(dtrain_torch INTERFACE "LINKER:-rpath-link,${_dtrain_nv_path}")
  endif()
endif()
