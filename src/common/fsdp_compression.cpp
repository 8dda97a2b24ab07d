// The words of --fsdp-compress (include/dtrain/fsdp_compression.h). In
// src/common because the train checks, the planner and the engine all read
// them, and none of those may see the others.
#include <dtrain/fsdp_compression.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dtrain {
namespace {

[[noreturn]] void refuse(const std::string& why) {
  throw std::invalid_argument("--fsdp-compress: " + why +
                              "; give none, or comma-separated params=none|bf16|int8|fp8, grads=none|bf16|int8, "
                              "block=N (e.g. params=int8,grads=bf16)");
}

ParamCompression param_mode(const std::string& value) {
  if (value == "none") return ParamCompression::None;
  if (value == "bf16") return ParamCompression::BF16;
  if (value == "int8") return ParamCompression::Int8;
  if (value == "fp8") return ParamCompression::FP8;
  refuse("params=" + value + " is not one of none, bf16, int8, fp8");
}

GradCompression grad_mode(const std::string& value) {
  if (value == "none") return GradCompression::None;
  if (value == "bf16") return GradCompression::BF16;
  if (value == "int8") return GradCompression::Int8;
  if (value == "fp8") refuse("grads=fp8 is not offered (e4m3's 3 mantissa bits are too coarse for gradient sums); use bf16 or int8");
  refuse("grads=" + value + " is not one of none, bf16, int8");
}

int64_t block_size(const std::string& value) {
  size_t used = 0;
  long long number = 0;
  try {
    number = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty() || number < 1 || number > (1 << 24))
    refuse("block=" + value + " must be a whole number of elements from 1 to 16777216");
  return number;
}

}  // namespace

const char* to_string(ParamCompression mode) {
  switch (mode) {
    case ParamCompression::None: return "none";
    case ParamCompression::BF16: return "bf16";
    case ParamCompression::Int8: return "int8";
    case ParamCompression::FP8: return "fp8";
  }
  return "?";
}

const char* to_string(GradCompression mode) {
  switch (mode) {
    case GradCompression::None: return "none";
    case GradCompression::BF16: return "bf16";
    case GradCompression::Int8: return "int8";
  }
  return "?";
}

CollectiveCompression parse_collective_compression(const std::string& text) {
  CollectiveCompression result;
  if (text == "none" || text.empty()) return result;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string pair = text.substr(begin, end - begin);
    const size_t equals = pair.find('=');
    if (equals == std::string::npos) refuse("'" + pair + "' is not key=value");
    const std::string key = pair.substr(0, equals), value = pair.substr(equals + 1);
    if (key == "params") result.params = param_mode(value);
    else if (key == "grads") result.grads = grad_mode(value);
    else if (key == "block") result.block_size = block_size(value);
    else refuse("unknown key '" + key + "'");
    begin = end + 1;
  }
  return result;
}

std::string to_string(const CollectiveCompression& c) {
  if (c.params == ParamCompression::None && c.grads == GradCompression::None) return "none";
  return std::string("params=") + to_string(c.params) + ",grads=" + to_string(c.grads) +
         ",block=" + std::to_string(c.block_size);
}

}  // namespace dtrain
