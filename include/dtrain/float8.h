// Float8 matrix multiplies for linear layers (--fp8): inputs, weights and
// gradients cast to 8-bit floats with dynamic scales and multiplied by
// at::_scaled_mm (fp32 accumulation, bf16 result), on Hopper/Ada GPUs at
// twice bf16's rate. Master weights, optimizer state and gradient reductions
// are untouched: only the three matrix multiplies of a linear layer change.
//
// A model opts in by calling dtrain::linear (or models::linear for a
// torch::nn::Linear) in its forward instead of torch::linear; the built-in
// transformers (gpt, gpt2, llama) do. The trainer installs the run's
// settings process-wide (Float8Scope); without them dtrain::linear is
// torch::linear. See docs/fp8.md.
//
// Note [float8 recipes]
// - tensorwise: one scale per tensor. Forward: input and weight in e4m3.
//   Backward: the output gradient in e5m2 (two more exponent bits: gradients
//   span a wider range than one scale per tensor can fit in e4m3's), both
//   gradient matrix multiplies in fp8. The input's scale is over this rank's
//   batch, so the rounding depends on how the global batch is split.
// - rowwise: one scale per row of every operand, everything in e4m3 (a scale
//   per row already fits each row's range; the GPU's rowwise kernel takes e4m3
//   only). The weight's gradient is computed in the compute dtype instead
//   (torchao's "rowwise_with_gw_hp"): its fp8 operands would be scaled per
//   column of the batch, i.e. over the batch again. So a rowwise run rounds
//   every token alone: its results do not depend on the batch split.
// Scales are powers of two (2^floor(log2(max_finite / amax))), so scaling
// and unscaling are exact and only the cast to fp8 rounds.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace dtrain {

enum class Float8Scaling { Off, Tensorwise, Rowwise };
// "off" | "tensorwise" | "rowwise"; anything else throws naming them.
Float8Scaling parse_float8_scaling(const std::string& name);
std::string float8_scaling_name(Float8Scaling scaling);

// How the fp8 operands are multiplied. Automatic: at::_scaled_mm on a GPU;
// on a CPU the emulation (fp8 values decoded to fp32, multiplied, scaled,
// rounded to bf16), which LibTorch's own CPU _scaled_mm equals up to its
// summation order and runs ~1.7x faster here.
enum class Float8Kernel { Automatic, ScaledMM, Emulated };

// Note [which layers run in fp8]
// A layer y = x W^T with W [N, K] runs in fp8 when K and N are multiples of
// 16 (the GPU kernel's rule, applied on every device) and its harmonic
// width K N / (K + N) is at least min_width. A layer's three matrix
// multiplies of M tokens save half their bf16 time, 3 M N K / R at bf16
// rate R, while its unfused casts move about 11 bytes per element of the
// input (M K) and of the output's gradient (M N): amax, scaling and cast,
// and the transposed copies of backward (the weight's, N K, are small next
// to them when M is large). fp8 pays when 3 M N K / R > 11 M (K + N) / B at
// memory bandwidth B, i.e. K N / (K + N) > 11 R / (3 B): about 760 on an
// H200 (989 TFLOP/s, 4.8 TB/s), 1080 on an H100 (3.35 TB/s). Hence 1024 by
// default, until the GPU kit's `dtrain bench fp8` sweep measures it
// (scripts/device/gpu_runs.sh, docs/fp8.md). 0: every eligible layer.
struct Float8Settings {
  Float8Scaling scaling = Float8Scaling::Off;
  int64_t min_width = 1024;
  Float8Kernel kernel = Float8Kernel::Automatic;
};

// Whether a layer of in_features K and out_features N runs in fp8 under
// `settings` (off: never).
bool float8_eligible(int64_t in_features, int64_t out_features, const Float8Settings& settings);

// The run's settings, process-wide (autograd's device threads and
// activation checkpointing's recomputation read them too); nullptr: off.
void set_float8_settings(const Float8Settings* settings);
const Float8Settings* float8_settings();

// How many dtrain::linear calls ran in fp8 and how many as torch::linear
// while settings were installed, since the last Float8Scope began (a run's
// final metrics line: a model whose layers never reach dtrain::linear shows
// as none).
struct Float8Calls {
  int64_t fp8 = 0;
  int64_t plain = 0;
};
Float8Calls float8_calls();

// Whether dtrain::linear has taken `weight` (its storage and offset in it)
// in fp8 since the settings were installed. FSDP's float8 all-gather asks it
// of every unit's gathered weights after the first step (Note [float8
// all-gather] in src/fsdp/float8_gather.cpp).
bool float8_took(const torch::Tensor& weight);
// The same by storage (a c10::StorageImpl) and offset, for views not at hand.
bool float8_took(const void* storage, int64_t storage_offset);

// Installs `settings` for its lifetime (a copy), restoring what was there.
class Float8Scope {
 public:
  explicit Float8Scope(const Float8Settings& settings);
  ~Float8Scope();
  Float8Scope(const Float8Scope&) = delete;
  Float8Scope& operator=(const Float8Scope&) = delete;

 private:
  Float8Settings settings_;
  const Float8Settings* previous_;
};

// The largest finite values of e4m3fn and e5m2.
constexpr double kFloat8E4M3Max = 448.0;
constexpr double kFloat8E5M2Max = 57344.0;
double float8_max(c10::ScalarType dtype);

// An fp8 tensor and the factor that turns its values back: x ~= data * inverse_scale
// (inverse_scale fp32: a scalar, or broadcastable along the scaled rows).
struct Float8Tensor {
  torch::Tensor data;
  torch::Tensor inverse_scale;
};

// The power-of-two scale that maps amax to at most dtype's largest finite
// value (fp32, amax's shape); amax is clamped below at 1e-12.
torch::Tensor float8_scale(const torch::Tensor& amax, c10::ScalarType dtype);

// x cast to `dtype` (e4m3fn or e5m2). reduce_dim unset: one scale for the
// whole tensor; else one per slice along reduce_dim (amax over that dim,
// kept as size 1), e.g. 1 for one scale per row of a matrix. An empty x
// casts to an empty tensor (its amax taken as 0).
Float8Tensor float8_cast(const torch::Tensor& x, c10::ScalarType dtype, std::optional<int64_t> reduce_dim = std::nullopt);

// a [M, K] row-major times b [K, N] column-major (b.t() contiguous), both
// fp8 with their inverse scales (scalars, or a: [M, 1] and b: [1, N]):
// (a.data b.data) * a.inverse_scale * b.inverse_scale, accumulated in fp32,
// as bf16. K and N must be multiples of 16. fast_accum: the GPU kernel's
// faster, less exact accumulation (forward only, as torchao does).
torch::Tensor float8_matmul(const Float8Tensor& a, const Float8Tensor& b, Float8Kernel kernel,
                            bool fast_accum = false);

// y = x W^T + b with the three matrix multiplies in fp8 under `scaling`
// (Note [float8 recipes]); x [..., K], weight [N, K], bias [N] or
// undefined. The result and the gradients have x's, W's and b's dtypes.
// Without tokens (x.numel() == 0) it is torch::linear, on every device.
torch::Tensor float8_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                            Float8Scaling scaling, Float8Kernel kernel = Float8Kernel::Automatic);

// torch::linear, or float8_linear where the installed settings take the layer.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias = {});

// Note [gathered float8 weights]
// FSDP's float8 all-gather registers the fp8 codes it gathered for a unit's
// weight under the weight's full view (storage and offset) while the unit
// is gathered; the tensorwise layer multiplies those directly instead of
// casting the weight again (the same products: both are the weight's
// values at power-of-two scales). Cleared when the unit reshards.
void set_gathered_float8_weight(const void* storage, int64_t storage_offset, Float8Tensor weight);
void clear_gathered_float8_weights(const void* storage);
std::optional<Float8Tensor> gathered_float8_weight(const torch::Tensor& weight);

}  // namespace dtrain
