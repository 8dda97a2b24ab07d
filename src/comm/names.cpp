// Names used in messages: the ones users write in Python and C++ alike.
#include "dtrain/comm.h"

namespace dtrain {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

std::string dtype_name(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat: return "float32";
    case torch::kDouble: return "float64";
    case torch::kBFloat16: return "bfloat16";
    case torch::kHalf: return "float16";
    case torch::kInt: return "int32";
    case torch::kLong: return "int64";
    case torch::kByte: return "uint8";
    case torch::kBool: return "bool";
    default: return c10::toString(dtype);
  }
}

}  // namespace dtrain
