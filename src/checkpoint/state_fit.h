// Whether a file's tensors fit a model: the one check behind load_state_into
// (a whole safetensors file in memory) and load_safetensors_into /
// check_safetensors_fits (only the file's header), so both say the same.
#pragma once

#include "checkpoint/safetensors_format.h"

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtrain::detail {

struct TensorSignature {
  std::string name;
  std::vector<int64_t> shape;
  torch::ScalarType dtype;
};

// Throws std::runtime_error "WHERE ...": names the model lacks or the file
// lacks, else the first shape that differs or dtype that does not widen
// exactly (float16/bfloat16 -> float32/float64, float32 -> float64).
void check_state_fits(const std::string& where, const std::vector<TensorSignature>& model,
                      const std::vector<TensorSignature>& file);

// The LibTorch dtype of a safetensors dtype.
torch::ScalarType torch_dtype_of(safetensors::DType dtype);

}  // namespace dtrain::detail
