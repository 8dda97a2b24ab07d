#include "train/cuda_runtime.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <ATen/cuda/CUDAContext.h>

namespace dtrain::train::cuda {

int device_count() { return static_cast<int>(c10::cuda::device_count()); }

std::string device_name(int index) { return at::cuda::getDeviceProperties(index)->name; }

void set_device(int index) { c10::cuda::set_device(static_cast<c10::DeviceIndex>(index)); }

void synchronize(int index) { c10::cuda::device_synchronize(), (void)index; }

MemoryPeaks memory_peaks(int index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(index));
  using Aggregate = c10::CachingAllocator::StatType;
  const auto all = static_cast<size_t>(Aggregate::AGGREGATE);
  return {stats.allocated_bytes[all].peak, stats.reserved_bytes[all].peak};
}

void reset_memory_peaks(int index) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(index));
}

}  // namespace dtrain::train::cuda
