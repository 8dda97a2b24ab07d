# dtrain compiles no CUDA kernels; naming the CUDA architectures skips
# LibTorch's GPU probe (a try_run that fails on machines without a GPU).
# Included before find_package(Torch) by dtrain's build and by its installed
# package config.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()
