// A build without CUDA: no device, and nothing to ask one.
#include "train/cuda_runtime.h"

#include <stdexcept>

namespace dtrain::train::cuda {

int device_count() { return 0; }
std::string device_name(int) { return ""; }
void set_device(int) { throw std::logic_error("cuda::set_device: this dtrain build has no CUDA"); }
void synchronize(int) {}
MemoryPeaks memory_peaks(int) { return {}; }
void reset_memory_peaks(int) {}

}  // namespace dtrain::train::cuda
