#include "fsdp/compression.h"

#include <torch/types.h>

#include <stdexcept>
#include <string>

namespace dtrain::detail {
namespace {

using fsdp_rules::WireFormat;

// The largest magnitude a byte of each format holds: int8 keeps -127..127
// (symmetric, so -128 is never used); e4m3's largest finite value is 448.
float largest_code(WireFormat format) { return format == WireFormat::Int8 ? 127.0f : 448.0f; }

torch::ScalarType code_dtype(WireFormat format) {
  return format == WireFormat::Int8 ? torch::kChar : torch::kFloat8_e4m3fn;
}

// `values` as [blocks, block_size] fp32, the tail padded with zeros (which
// change no block's absmax).
torch::Tensor as_blocks(const torch::Tensor& values, int64_t block_size) {
  const int64_t count = values.numel();
  const int64_t blocks = fsdp_rules::scale_blocks(count, block_size);
  auto x = values.to(torch::kFloat);
  if (count == blocks * block_size) return x.view({blocks, block_size});
  auto padded = torch::zeros({blocks * block_size}, x.options());
  padded.narrow(0, 0, count).copy_(x);
  return padded.view({blocks, block_size});
}

}  // namespace

void encode_record(WireFormat format, int64_t block_size, const torch::Tensor& values, torch::Tensor record) {
  torch::NoGradGuard no_grad;
  const int64_t count = values.numel();
  if (format == WireFormat::Plain) {
    record.copy_(values.contiguous().view(torch::kByte));
    return;
  }
  if (format == WireFormat::BF16) {
    record.copy_(values.to(torch::kBFloat16).contiguous().view(torch::kByte));
    return;
  }
  const auto blocks = as_blocks(values, block_size);
  const auto scales = blocks.abs().amax(1).div_(largest_code(format));
  const auto divisor = torch::where(scales > 0, scales, torch::ones_like(scales)).unsqueeze(1);
  auto scaled = blocks / divisor;
  if (format == WireFormat::Int8) scaled.round_();
  const float limit = largest_code(format);
  const auto codes = scaled.clamp_(-limit, limit).to(code_dtype(format)).view({-1}).narrow(0, 0, count);
  const int64_t scale_bytes = 4 * scales.numel();
  record.narrow(0, 0, scale_bytes).copy_(scales.view(torch::kByte));
  record.narrow(0, scale_bytes, count).copy_(codes.view(torch::kByte));
}

torch::Tensor decode_record(WireFormat format, int64_t block_size, const torch::Tensor& record, int64_t count) {
  torch::NoGradGuard no_grad;
  if (format == WireFormat::Plain) throw std::logic_error("decode_record: plain records are not decoded");
  if (format == WireFormat::BF16) {
    // Copied out rather than viewed: a record may start at an odd byte.
    auto values = torch::empty({count}, record.options().dtype(torch::kBFloat16));
    values.view(torch::kByte).copy_(record.narrow(0, 0, 2 * count));
    return values.to(torch::kFloat);
  }
  const int64_t blocks = fsdp_rules::scale_blocks(count, block_size);
  auto scales = torch::empty({blocks}, record.options().dtype(torch::kFloat));
  scales.view(torch::kByte).copy_(record.narrow(0, 0, 4 * blocks));
  auto values = record.narrow(0, 4 * blocks, count).view(code_dtype(format)).to(torch::kFloat);
  return values.mul_(scales.repeat_interleave(block_size).narrow(0, 0, count));
}

void check_fp8_supported() {
  try {
    const auto x = torch::tensor({1.0f, -2.5f, 448.0f});
    const auto back = x.to(torch::kFloat8_e4m3fn).to(torch::kFloat);
    if (torch::equal(back, x)) return;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(
      "FSDP: params=fp8 is not supported: this LibTorch cannot cast float32 to float8 e4m3 on the CPU; use int8 "
      "(the same bytes per element, one scale per block)");
}

}  // namespace dtrain::detail
