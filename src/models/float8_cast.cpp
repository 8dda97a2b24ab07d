// Scales, casts and the matrix multiply of fp8 operands (dtrain/float8.h).
#include <dtrain/float8.h>

#include <ATen/ops/_scaled_mm.h>
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <limits>
#include <stdexcept>
#include <vector>
#include <string>

namespace dtrain {
namespace {

void require(bool condition, const std::string& what) {
  if (!condition) throw std::invalid_argument("float8_matmul: " + what);
}

// The operands' layout and shapes, checked alike on every device, so that a
// CPU run refuses what the GPU kernel would (A CUDA path must not accept
// less than the CPU path).
void check_operands(const Float8Tensor& a, const Float8Tensor& b) {
  require(a.data.dim() == 2 && b.data.dim() == 2, "operands must be matrices");
  require(a.data.size(1) == b.data.size(0), "inner dimensions differ");
  require(a.data.size(1) % 16 == 0 && b.data.size(1) % 16 == 0,
          "K = " + std::to_string(a.data.size(1)) + " and N = " + std::to_string(b.data.size(1)) +
              " must be multiples of 16");
  require(a.data.size(0) == 0 || a.data.stride(1) == 1, "a must be row-major");
  require(b.data.size(1) == 0 || b.data.stride(0) == 1, "b must be column-major");
  require(a.inverse_scale.scalar_type() == torch::kFloat && b.inverse_scale.scalar_type() == torch::kFloat,
          "scales must be float32");
}

bool on_gpu(const torch::Tensor& t) { return t.device().is_cuda(); }

}  // namespace

double float8_max(c10::ScalarType dtype) {
  if (dtype == torch::kFloat8_e4m3fn) return kFloat8E4M3Max;
  if (dtype == torch::kFloat8_e5m2) return kFloat8E5M2Max;
  throw std::invalid_argument(std::string("float8: no fp8 format ") + c10::toString(dtype) +
                              " (float8_e4m3fn or float8_e5m2)");
}

torch::Tensor float8_scale(const torch::Tensor& amax, c10::ScalarType dtype) {
  const auto ratio = float8_max(dtype) / amax.to(torch::kFloat).clamp_min(1e-12);
  return torch::exp2(torch::floor(torch::log2(ratio)));
}

Float8Tensor float8_cast(const torch::Tensor& x, c10::ScalarType dtype, std::optional<int64_t> reduce_dim) {
  torch::NoGradGuard no_grad;
  // max |x| in one pass over x (no |x| temporary).
  const double inf = std::numeric_limits<double>::infinity();
  torch::Tensor amax;
  if (x.numel() == 0) {
    // The inf norm of nothing is refused ("no identity"); an empty tensor's
    // amax is 0, so it casts to an empty tensor (e.g. an expert given no tokens).
    auto shape = x.sizes().vec();
    if (reduce_dim) shape[static_cast<size_t>(c10::maybe_wrap_dim(*reduce_dim, x.dim()))] = 1;
    amax = torch::zeros(reduce_dim ? shape : std::vector<int64_t>{}, x.options());
  } else {
    amax = reduce_dim ? torch::linalg_vector_norm(x, inf, std::vector<int64_t>{*reduce_dim}, /*keepdim=*/true)
                      : torch::linalg_vector_norm(x, inf);
  }
  const auto scale = float8_scale(amax, dtype);
  // A power of two: exact in x's dtype (bf16 keeps fp32's exponents), so
  // the cast to fp8 is the only rounding. No clamp: |x| scale <= the
  // format's largest value, but where max / amax rounded up to the power of
  // two, and then by a relative 2^-24, which rounds back to that value.
  return {(x * scale.to(x.scalar_type())).to(dtype), scale.reciprocal()};
}

torch::Tensor float8_matmul(const Float8Tensor& a, const Float8Tensor& b, Float8Kernel kernel, bool fast_accum) {
  check_operands(a, b);
  if (kernel == Float8Kernel::Automatic) kernel = on_gpu(a.data) ? Float8Kernel::ScaledMM : Float8Kernel::Emulated;
  if (kernel == Float8Kernel::Emulated) {
    torch::NoGradGuard no_grad;
    // Both scale factors multiply the fp32 sum, as the kernel applies them.
    return torch::mm(a.data.to(torch::kFloat), b.data.to(torch::kFloat))
        .mul_(a.inverse_scale)
        .mul_(b.inverse_scale)
        .to(torch::kBFloat16);
  }
  try {
    return at::_scaled_mm(a.data, b.data, a.inverse_scale, b.inverse_scale, std::nullopt, std::nullopt,
                          torch::kBFloat16, fast_accum);
  } catch (const c10::Error& e) {
    // LibTorch's own words first: a device without fp8 kernels says so there.
    throw std::runtime_error(std::string("--fp8: at::_scaled_mm failed on ") + a.data.device().str() + ": " +
                             e.what_without_backtrace() +
                             " (fp8 matrix multiplies run on Ada and Hopper GPUs; elsewhere use --fp8 off)");
  }
}

}  // namespace dtrain
