// Mixed precision for the data-parallel engines (DDP and FSDP): compute in a
// narrow dtype while the optimizer updates full-precision master weights.
#pragma once

#include <c10/core/ScalarType.h>

namespace dtrain {

struct MixedPrecision {
  // dtype forward and backward compute in: the parameters are cast to it
  // (FSDP: the all-gather moves it; DDP: a compute copy per parameter). The
  // weights the optimizer updates stay in the parameters' own dtype (fp32
  // master weights).
  c10::ScalarType param_dtype = c10::kFloat;
  // dtype in which gradients are reduce-scattered (FSDP) or all-reduced
  // (DDP: its buckets' dtype).
  c10::ScalarType reduce_dtype = c10::kFloat;
  // Floating outputs of the root forward are cast to this dtype.
  c10::ScalarType output_dtype = c10::kFloat;
};

}  // namespace dtrain
