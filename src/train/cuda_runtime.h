// What the trainer asks of the CUDA runtime, without CUDA headers: the
// definitions are in cuda_runtime.cpp in a CUDA build and in
// cuda_runtime_stub.cpp (no GPU, every query answered "none") otherwise.
#pragma once

#include <cstdint>
#include <string>

namespace dtrain::train::cuda {

// GPUs this process can use (0 without CUDA).
int device_count();
// "NVIDIA H200" ("" without CUDA).
std::string device_name(int index);
// Makes `index` the calling thread's current device.
void set_device(int index);
// Waits for the device's queued work (timing).
void synchronize(int index);

// The caching allocator's high-water marks since the last reset: bytes
// handed to tensors, and bytes held from the driver (allocated + cached).
struct MemoryPeaks {
  int64_t allocated = 0;
  int64_t reserved = 0;
};
MemoryPeaks memory_peaks(int index);
void reset_memory_peaks(int index);

}  // namespace dtrain::train::cuda
