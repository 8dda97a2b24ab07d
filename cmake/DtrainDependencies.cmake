# Finds dtrain's dependencies and prepares LibTorch for linking.
# Also used by dtrainConfig.cmake for projects that consume dtrain.
find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(ZLIB REQUIRED)  # gzipped datasets (src/data)
include(${CMAKE_CURRENT_LIST_DIR}/dtrainTorchArch.cmake)
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
