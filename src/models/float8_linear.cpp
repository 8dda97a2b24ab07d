// Linear layers in fp8 (dtrain/float8.h): the settings a run installs, which
// layers they take, and the autograd function of one layer.
#include <dtrain/float8.h>

#include <torch/torch.h>

#include <atomic>
#include <map>
#include <limits>
#include <mutex>
#include <set>
#include <utility>
#include <stdexcept>

namespace dtrain {
namespace {

// Set by the trainer's thread, read by autograd's too (as Note [sequence context]).
std::atomic<const Float8Settings*> installed_settings{nullptr};
std::atomic<int64_t> fp8_calls{0}, plain_calls{0};

// The weights dtrain::linear took in fp8, by storage and offset: what FSDP's
// gathered views of a unit's weights are, step after step.
using WeightKey = std::pair<const void*, int64_t>;
std::mutex taken_mutex;
std::set<WeightKey> taken_weights;

WeightKey key_of(const torch::Tensor& weight) {
  return {weight.storage().unsafeGetStorageImpl(), weight.storage_offset()};
}

// Note [gathered float8 weights]
std::mutex gathered_mutex;
std::map<WeightKey, Float8Tensor> gathered_weights;

// The weight in e4m3 with one scale: FSDP's gathered codes when it has them, else cast here.
Float8Tensor tensorwise_weight(const torch::Tensor& weight) {
  if (auto gathered = gathered_float8_weight(weight)) return *gathered;
  return float8_cast(weight, torch::kFloat8_e4m3fn);
}

int64_t round_up_16(int64_t n) { return (n + 15) / 16 * 16; }

// fp8 tensors are rearranged as bytes: their bit patterns move unchanged,
// and byte copies and zero padding run on every device (a zero byte is +0
// in both formats).
torch::Tensor as_bytes(const torch::Tensor& t) { return t.view(torch::kUInt8); }

// [rows, cols] row-major fp8 -> the same matrix column-major.
torch::Tensor column_major(const torch::Tensor& t) {
  return as_bytes(t).t().contiguous().t().view(t.scalar_type());
}

// Rows of zeros appended up to a multiple of 16 (the kernel's rule for an
// inner dimension; zeros add nothing to the sums).
torch::Tensor pad_rows(const torch::Tensor& t) {
  const int64_t rows = t.size(0), padded = round_up_16(rows);
  if (padded == rows) return t;
  return torch::constant_pad_nd(as_bytes(t), {0, 0, 0, padded - rows}, 0).view(t.scalar_type());
}

// Note [float8 recipes]. Saved for backward: tensorwise, the input in fp8
// (a byte per element) and the weight as given; rowwise, both as given.
// The weight is kept as given, not in fp8, so that under FSDP it stays a
// view of the gathered unit, freed after forward and gathered again for
// backward, and is cast again there.
class Float8LinearFunction : public torch::autograd::Function<Float8LinearFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, int64_t scaling, int64_t kernel_choice) {
    const auto kernel = static_cast<Float8Kernel>(kernel_choice);
    const int64_t N = weight.size(0), K = weight.size(1);
    const auto x2 = x.reshape({-1, K}).contiguous();  // the kernel's row-major first operand
    torch::Tensor y;
    if (static_cast<Float8Scaling>(scaling) == Float8Scaling::Tensorwise) {
      const Float8Tensor x8 = float8_cast(x2, torch::kFloat8_e4m3fn);
      const Float8Tensor w8 = tensorwise_weight(weight);
      y = float8_matmul(x8, {w8.data.t(), w8.inverse_scale}, kernel, /*fast_accum=*/true);
      ctx->save_for_backward({x8.data, x8.inverse_scale, weight});
    } else {
      const Float8Tensor x8 = float8_cast(x2, torch::kFloat8_e4m3fn, 1);
      const Float8Tensor w8 = float8_cast(weight, torch::kFloat8_e4m3fn, 1);  // a scale per output row
      y = float8_matmul(x8, {w8.data.t(), w8.inverse_scale.t()}, kernel, /*fast_accum=*/true);
      ctx->save_for_backward({x2, weight});
    }
    ctx->saved_data["scaling"] = scaling;
    ctx->saved_data["kernel"] = kernel_choice;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["x_shape"] = x.sizes().vec();
    y = y.to(x.scalar_type());
    auto shape = x.sizes().vec();
    shape.back() = N;
    return y.view(shape);
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto kernel = static_cast<Float8Kernel>(ctx->saved_data["kernel"].toInt());
    const auto x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto x_shape = ctx->saved_data["x_shape"].toIntVector();
    const torch::Tensor& weight = saved.back();
    const int64_t N = weight.size(0);
    const auto go = grads[0].reshape({-1, N}).contiguous();
    torch::Tensor grad_x, grad_w;
    if (static_cast<Float8Scaling>(ctx->saved_data["scaling"].toInt()) == Float8Scaling::Tensorwise) {
      const Float8Tensor x8{saved[0], saved[1]};
      const Float8Tensor w8 = tensorwise_weight(weight);
      const Float8Tensor g8 = float8_cast(go, torch::kFloat8_e5m2);
      grad_x = float8_matmul(g8, {column_major(w8.data), w8.inverse_scale}, kernel);  // [M,N] [N,K]
      // [N,M] [M,K], the tokens padded to the kernel's multiple of 16.
      const auto g_rows = pad_rows(g8.data), x_rows = pad_rows(x8.data);
      grad_w = float8_matmul({as_bytes(g_rows).t().contiguous().view(g_rows.scalar_type()), g8.inverse_scale},
                             {column_major(x_rows), x8.inverse_scale}, kernel);
    } else {
      const torch::Tensor& x2 = saved[0];
      const Float8Tensor g8 = float8_cast(go, torch::kFloat8_e4m3fn, 1);       // a scale per token
      const Float8Tensor wk = float8_cast(weight, torch::kFloat8_e4m3fn, 0);  // a scale per input feature
      grad_x = float8_matmul(g8, {column_major(wk.data), wk.inverse_scale}, kernel);
      grad_w = torch::mm(go.to(x2.scalar_type()).t(), x2);  // in the compute dtype: Note [float8 recipes]
    }
    return {grad_x.to(x_dtype).view(x_shape), grad_w.to(weight.scalar_type()), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

Float8Scaling parse_float8_scaling(const std::string& name) {
  if (name == "off") return Float8Scaling::Off;
  if (name == "tensorwise") return Float8Scaling::Tensorwise;
  if (name == "rowwise") return Float8Scaling::Rowwise;
  throw std::invalid_argument("--fp8 must be off, tensorwise or rowwise, got '" + name + "'");
}

std::string float8_scaling_name(Float8Scaling scaling) {
  switch (scaling) {
    case Float8Scaling::Tensorwise: return "tensorwise";
    case Float8Scaling::Rowwise: return "rowwise";
    case Float8Scaling::Off: break;
  }
  return "off";
}

bool float8_eligible(int64_t in_features, int64_t out_features, const Float8Settings& settings) {
  if (settings.scaling == Float8Scaling::Off) return false;
  if (in_features <= 0 || out_features <= 0 || in_features % 16 != 0 || out_features % 16 != 0) return false;
  // K N / (K + N) >= min_width, in integers wide enough for any int64 width.
  return static_cast<__int128>(in_features) * out_features >=
         static_cast<__int128>(settings.min_width) * (in_features + out_features);
}

void set_float8_settings(const Float8Settings* settings) { installed_settings.store(settings); }
const Float8Settings* float8_settings() { return installed_settings.load(); }

Float8Scope::Float8Scope(const Float8Settings& settings) : settings_(settings), previous_(float8_settings()) {
  fp8_calls = 0;
  plain_calls = 0;
  {
    std::lock_guard<std::mutex> lock(taken_mutex);
    taken_weights.clear();
  }
  {
    std::lock_guard<std::mutex> lock(gathered_mutex);
    gathered_weights.clear();
  }
  set_float8_settings(&settings_);
}

Float8Calls float8_calls() { return {fp8_calls.load(), plain_calls.load()}; }

bool float8_took(const torch::Tensor& weight) { return weight.has_storage() && float8_took(key_of(weight).first, weight.storage_offset()); }

void set_gathered_float8_weight(const void* storage, int64_t storage_offset, Float8Tensor weight) {
  std::lock_guard<std::mutex> lock(gathered_mutex);
  gathered_weights[{storage, storage_offset}] = std::move(weight);
}

void clear_gathered_float8_weights(const void* storage) {
  std::lock_guard<std::mutex> lock(gathered_mutex);
  auto it = gathered_weights.lower_bound({storage, std::numeric_limits<int64_t>::min()});
  while (it != gathered_weights.end() && it->first.first == storage) it = gathered_weights.erase(it);
}

std::optional<Float8Tensor> gathered_float8_weight(const torch::Tensor& weight) {
  if (!weight.has_storage()) return std::nullopt;
  std::lock_guard<std::mutex> lock(gathered_mutex);
  if (gathered_weights.empty()) return std::nullopt;
  const auto it = gathered_weights.find(key_of(weight));
  if (it == gathered_weights.end()) return std::nullopt;
  return it->second;
}

bool float8_took(const void* storage, int64_t storage_offset) {
  std::lock_guard<std::mutex> lock(taken_mutex);
  return taken_weights.count({storage, storage_offset}) > 0;
}
Float8Scope::~Float8Scope() { set_float8_settings(previous_); }

torch::Tensor float8_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                            Float8Scaling scaling, Float8Kernel kernel) {
  if (scaling == Float8Scaling::Off) return torch::linear(x, weight, bias);
  if (weight.dim() != 2 || x.dim() < 1 || x.size(-1) != weight.size(1))
    throw std::invalid_argument("float8_linear: x [..., K] and weight [N, K] expected");
  // No tokens (an expert routed none, a rank's empty slice): nothing to
  // multiply, so no kernel is asked to multiply an empty operand, which a
  // GPU's may refuse where the CPU's accepts it. The plain layer gives the
  // same empty output and zero weight gradient on every device.
  if (x.numel() == 0) return torch::linear(x, weight, bias);
  const auto y =
      Float8LinearFunction::apply(x, weight, static_cast<int64_t>(scaling), static_cast<int64_t>(kernel));
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;  // the bias's gradient by autograd
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) {
  const Float8Settings* settings = float8_settings();
  if (settings == nullptr) return torch::linear(x, weight, bias);
  if (weight.dim() == 2 && float8_eligible(weight.size(1), weight.size(0), *settings)) {
    ++fp8_calls;
    if (weight.has_storage()) {
      std::lock_guard<std::mutex> lock(taken_mutex);
      taken_weights.insert(key_of(weight));
    }
    return float8_linear(x, weight, bias, settings->scaling, settings->kernel);
  }
  ++plain_calls;
  return torch::linear(x, weight, bias);
}

}  // namespace dtrain
