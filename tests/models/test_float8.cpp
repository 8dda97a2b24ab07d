// Float8 linear layers (include/dtrain/float8.h): scales and casts against
// hand values, the emulation against LibTorch's own _scaled_mm (which has a
// CPU kernel in 2.15), the layer's forward and gradients against the same
// casts multiplied in fp32, the layer filter, and the installed settings.
#include <dtrain/float8.h>
#include <dtrain/models.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <stdexcept>

namespace {

using dtrain::Float8Kernel;
using dtrain::Float8Scaling;
using dtrain::Float8Settings;
using dtrain::Float8Tensor;

const auto kE4M3 = torch::kFloat8_e4m3fn;
const auto kE5M2 = torch::kFloat8_e5m2;

torch::Tensor decoded(const Float8Tensor& t) { return t.data.to(torch::kFloat) * t.inverse_scale; }

// Equal up to one bf16 rounding of either (the kernels' summation orders differ).
void expect_bf16_close(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.to(torch::kFloat), y = b.to(torch::kFloat);
  const auto bound = torch::maximum(x.abs(), y.abs()) * (1.0 / 128) + 1e-6;
  EXPECT_TRUE(((x - y).abs() <= bound).all().item<bool>()) << "max difference " << (x - y).abs().max().item<float>();
}

TEST(Float8, ScalesArePowersOfTwoBelowTheFormatsMaximum) {
  const auto scale = [](float amax, c10::ScalarType dtype) {
    return dtrain::float8_scale(torch::tensor(amax), dtype).item<float>();
  };
  EXPECT_EQ(scale(448, kE4M3), 1.0f);
  EXPECT_EQ(scale(1, kE4M3), 256.0f);  // 448 / 1 -> 2^8
  EXPECT_EQ(scale(3, kE4M3), 128.0f);  // 149.3 -> 2^7
  EXPECT_EQ(scale(449, kE4M3), 0.5f);
  EXPECT_EQ(scale(1, kE5M2), 32768.0f);  // 57344 -> 2^15
  EXPECT_EQ(scale(0, kE4M3), std::ldexp(1.0f, 48));  // amax clamped at 1e-12: 4.48e14 -> 2^48
  EXPECT_THROW(dtrain::float8_max(torch::kBFloat16), std::invalid_argument);
}

TEST(Float8, TensorwiseCastRoundsToE4M3AfterScaling) {
  // amax 3 -> scale 128: 128, -38.4, 384; e4m3 steps by 4 in [32, 64), so -38.4 -> -40.
  const auto cast = dtrain::float8_cast(torch::tensor({1.0f, -0.3f, 3.0f}), kE4M3);
  EXPECT_EQ(cast.data.scalar_type(), kE4M3);
  EXPECT_EQ(cast.inverse_scale.item<float>(), 1.0f / 128);
  EXPECT_TRUE(torch::equal(cast.data.to(torch::kFloat), torch::tensor({128.0f, -40.0f, 384.0f})));
  EXPECT_TRUE(torch::equal(decoded(cast), torch::tensor({1.0f, -0.3125f, 3.0f})));
}

TEST(Float8, RowwiseCastScalesEachRow) {
  const auto cast = dtrain::float8_cast(torch::tensor({1.0f, 2.0f, 0.5f, 96.0f}).view({2, 2}), kE4M3, 1);
  ASSERT_EQ(cast.inverse_scale.sizes(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(cast.inverse_scale[0].item<float>(), 1.0f / 128);  // amax 2: 224 -> 2^7
  EXPECT_EQ(cast.inverse_scale[1].item<float>(), 1.0f / 4);    // amax 96: 4.67 -> 2^2
  EXPECT_TRUE(torch::equal(decoded(cast), torch::tensor({1.0f, 2.0f, 0.5f, 96.0f}).view({2, 2})));
}

TEST(Float8, E5M2KeepsRangeE4M3Rounds) {
  // One scale for values far apart. e4m3 (scale 2^-3 for 3000) keeps 0.5 as
  // 2^-4 but rounds 0.002 -> 2.5e-4 below its smallest subnormal, 2^-9, to 0;
  // e5m2 (scale 2^4) keeps it: 0.032 is above its 2^-16.
  const auto x = torch::tensor({3000.0f, 0.5f});
  EXPECT_EQ(decoded(dtrain::float8_cast(x, kE4M3))[1].item<float>(), 0.5f);
  const auto small = torch::tensor({3000.0f, 0.002f});
  EXPECT_EQ(decoded(dtrain::float8_cast(small, kE4M3))[1].item<float>(), 0.0f);
  EXPECT_GT(decoded(dtrain::float8_cast(small, kE5M2))[1].item<float>(), 0.0f);
}

Float8Tensor random_fp8(int64_t rows, int64_t cols, std::optional<int64_t> dim, c10::ScalarType dtype = kE4M3) {
  return dtrain::float8_cast(torch::randn({rows, cols}), dtype, dim);
}

TEST(Float8, EmulationEqualsLibTorchsScaledMM) {
  torch::manual_seed(1);
  for (const bool rowwise : {false, true}) {
    SCOPED_TRACE(rowwise ? "rowwise" : "tensorwise");
    const auto a = random_fp8(37, 64, rowwise ? std::optional<int64_t>(1) : std::nullopt);
    const auto b = random_fp8(48, 64, rowwise ? std::optional<int64_t>(1) : std::nullopt);
    const Float8Tensor bt{b.data.t(), rowwise ? b.inverse_scale.t() : b.inverse_scale};
    const auto kernel = dtrain::float8_matmul(a, bt, Float8Kernel::ScaledMM);
    const auto emulated = dtrain::float8_matmul(a, bt, Float8Kernel::Emulated);
    EXPECT_EQ(emulated.scalar_type(), torch::kBFloat16);
    expect_bf16_close(kernel, emulated);
    expect_bf16_close(emulated, decoded(a).mm(decoded(b).t()));
  }
  // e5m2 gradients times e4m3 weights, as tensorwise backward multiplies them.
  const auto g = random_fp8(32, 48, std::nullopt, kE5M2);
  const auto w = random_fp8(48, 64, std::nullopt);
  const Float8Tensor w_cols{w.data.t().contiguous().t(), w.inverse_scale};
  expect_bf16_close(dtrain::float8_matmul(g, w_cols, Float8Kernel::ScaledMM),
                    dtrain::float8_matmul(g, w_cols, Float8Kernel::Emulated));
}

TEST(Float8, MatmulRefusesWhatTheGPUKernelRefuses) {
  const auto a = random_fp8(16, 24, std::nullopt);  // K = 24
  const auto b = random_fp8(32, 24, std::nullopt);
  EXPECT_THROW(dtrain::float8_matmul(a, {b.data.t(), b.inverse_scale}, Float8Kernel::Emulated),
               std::invalid_argument);
  const auto c = random_fp8(16, 32, std::nullopt);
  const auto d = random_fp8(32, 48, std::nullopt);  // [K, N] row-major: not column-major
  EXPECT_THROW(dtrain::float8_matmul(c, d, Float8Kernel::Emulated), std::invalid_argument);
}

// The layer against its definition: the same casts, multiplied in fp32.
TEST(Float8, LinearForwardAndGradientsAreTheCastsMultiplied) {
  torch::manual_seed(2);
  const int64_t M = 37, K = 64, N = 48;  // M not a multiple of 16: the weight gradient pads it
  for (const auto kernel : {Float8Kernel::Emulated, Float8Kernel::ScaledMM}) {
    for (const auto scaling : {Float8Scaling::Tensorwise, Float8Scaling::Rowwise}) {
      SCOPED_TRACE(dtrain::float8_scaling_name(scaling) + (kernel == Float8Kernel::Emulated ? " emulated" : " kernel"));
      const auto x = torch::randn({M, K}).requires_grad_();
      const auto w = (torch::randn({N, K}) * 0.1).requires_grad_();
      const auto bias = torch::randn({N}).requires_grad_();
      const auto y = dtrain::float8_linear(x.view({1, M, K}), w, bias, scaling, kernel);
      ASSERT_EQ(y.sizes(), (std::vector<int64_t>{1, M, N}));
      const auto go = torch::randn({1, M, N});
      y.backward(go);

      const bool rowwise = scaling == Float8Scaling::Rowwise;
      const auto row = rowwise ? std::optional<int64_t>(1) : std::nullopt;
      const auto x8 = dtrain::float8_cast(x.detach(), kE4M3, row);
      const auto w8 = dtrain::float8_cast(w.detach(), kE4M3, row);
      expect_bf16_close(y.detach().view({M, N}) - bias.detach(), decoded(x8).mm(decoded(w8).t()));
      const auto g2 = go.view({M, N});
      const auto g8 = dtrain::float8_cast(g2, rowwise ? kE4M3 : kE5M2, row);
      const auto wk = dtrain::float8_cast(w.detach(), kE4M3, rowwise ? std::optional<int64_t>(0) : std::nullopt);
      expect_bf16_close(x.grad(), decoded(g8).mm(decoded(wk)));
      if (rowwise)
        EXPECT_TRUE(torch::allclose(w.grad(), g2.t().mm(x.detach()), 1e-5, 1e-5));  // the weight gradient in fp32
      else
        expect_bf16_close(w.grad(), decoded(g8).t().mm(decoded(x8)));
      EXPECT_TRUE(torch::allclose(bias.grad(), g2.sum(0)));
      // And near the exact layer: e4m3 keeps 3 mantissa bits.
      const auto exact = torch::linear(x.detach(), w.detach(), bias.detach());
      EXPECT_LT(((y.detach().view({M, N}) - exact).norm() / exact.norm()).item<float>(), 0.06);
    }
  }
}

TEST(Float8, LinearKeepsBf16Inputs) {
  const auto x = torch::randn({4, 8, 32}).to(torch::kBFloat16).requires_grad_();
  const auto w = torch::randn({16, 32}).to(torch::kBFloat16).requires_grad_();
  const auto y = dtrain::float8_linear(x, w, {}, Float8Scaling::Tensorwise);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  y.sum().backward();
  EXPECT_EQ(x.grad().scalar_type(), torch::kBFloat16);
  EXPECT_EQ(w.grad().scalar_type(), torch::kBFloat16);
}

// No tokens: the casts give empty tensors with finite scales, and the layer
// an empty output and a zero weight gradient, as torch::linear does, with no
// kernel asked to multiply an empty operand (Note [no empty batches]: CUDA's
// kernels may refuse what the CPU's accept).
TEST(Float8, EmptyInputsGiveEmptyOutputs) {
  const auto empty = torch::randn({0, 32});
  for (const auto row : {std::optional<int64_t>(), std::optional<int64_t>(1), std::optional<int64_t>(-1)}) {
    const auto cast = dtrain::float8_cast(empty, kE4M3, row);
    EXPECT_EQ(cast.data.sizes(), empty.sizes());
    EXPECT_EQ(cast.data.scalar_type(), kE4M3);
    EXPECT_TRUE(torch::isfinite(cast.inverse_scale).all().item<bool>());
  }
  for (const auto kernel : {Float8Kernel::Emulated, Float8Kernel::ScaledMM}) {
    for (const auto scaling : {Float8Scaling::Tensorwise, Float8Scaling::Rowwise}) {
      SCOPED_TRACE(dtrain::float8_scaling_name(scaling));
      const auto x = torch::randn({2, 0, 32}).requires_grad_();
      const auto w = torch::randn({16, 32}).requires_grad_();
      const auto bias = torch::randn({16}).requires_grad_();
      const auto y = dtrain::float8_linear(x, w, bias, scaling, kernel);
      EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 0, 16}));
      y.sum().backward();
      EXPECT_EQ(x.grad().sizes(), x.sizes());
      EXPECT_TRUE(torch::equal(w.grad(), torch::zeros_like(w)));
      EXPECT_TRUE(torch::equal(bias.grad(), torch::zeros_like(bias)));
    }
  }
}

// Rowwise rounds every token alone: a batch computed in two halves gives the
// same outputs and input gradients (Note [float8 recipes]), which is why a
// rowwise fsdp run equals one process.
TEST(Float8, RowwiseDoesNotDependOnTheBatchSplit) {
  torch::manual_seed(3);
  // The second half 8x larger: its power-of-two scale differs from the first's.
  const auto x = torch::randn({32, 64}) * torch::cat({torch::ones({16, 1}), torch::full({16, 1}, 8.0)});
  const auto w = torch::randn({48, 64}) * 0.1;
  const auto go = torch::randn({32, 48});
  const auto run = [&](const torch::Tensor& part, const torch::Tensor& grad, Float8Scaling scaling) {
    const auto leaf = part.clone().requires_grad_();
    const auto y = dtrain::float8_linear(leaf, w, {}, scaling);
    y.backward(grad);
    return std::make_pair(y.detach(), leaf.grad());
  };
  for (const auto scaling : {Float8Scaling::Rowwise, Float8Scaling::Tensorwise}) {
    const auto whole = run(x, go, scaling);
    const auto first = run(x.narrow(0, 0, 16), go.narrow(0, 0, 16), scaling);
    const auto second = run(x.narrow(0, 16, 16), go.narrow(0, 16, 16), scaling);
    const bool same = torch::equal(whole.first, torch::cat({first.first, second.first})) &&
                      torch::equal(whole.second, torch::cat({first.second, second.second}));
    EXPECT_EQ(same, scaling == Float8Scaling::Rowwise) << dtrain::float8_scaling_name(scaling);
  }
}

TEST(Float8, FilterTakesLayersByWidth) {
  Float8Settings settings;
  settings.scaling = Float8Scaling::Tensorwise;
  EXPECT_TRUE(dtrain::float8_eligible(2048, 2048, settings));   // K N / (K + N) = 1024
  EXPECT_TRUE(dtrain::float8_eligible(2048, 8192, settings));   // 1638
  EXPECT_FALSE(dtrain::float8_eligible(1024, 4096, settings));  // 819
  EXPECT_FALSE(dtrain::float8_eligible(2040, 8192, settings));  // K not a multiple of 16
  settings.min_width = 0;
  EXPECT_TRUE(dtrain::float8_eligible(16, 32, settings));
  EXPECT_FALSE(dtrain::float8_eligible(16, 24, settings));
  settings.scaling = Float8Scaling::Off;
  EXPECT_FALSE(dtrain::float8_eligible(4096, 4096, settings));
  EXPECT_EQ(dtrain::parse_float8_scaling("rowwise"), Float8Scaling::Rowwise);
  EXPECT_THROW(dtrain::parse_float8_scaling("e4m3"), std::invalid_argument);
}

TEST(Float8, LinearFollowsTheInstalledSettings) {
  torch::manual_seed(4);
  const auto x = torch::randn({8, 32});
  const auto w = torch::randn({32, 32});
  const auto plain = torch::linear(x, w);
  EXPECT_TRUE(torch::equal(dtrain::linear(x, w), plain));
  Float8Settings settings;
  settings.scaling = Float8Scaling::Tensorwise;
  {
    dtrain::Float8Scope scope(settings);  // min_width 1024: a 32-wide layer stays as it is
    EXPECT_TRUE(torch::equal(dtrain::linear(x, w), plain));
  }
  settings.min_width = 0;
  {
    dtrain::Float8Scope scope(settings);
    const auto y = dtrain::linear(x, w);
    EXPECT_FALSE(torch::equal(y, plain));
    EXPECT_TRUE(torch::equal(y, dtrain::float8_linear(x, w, {}, Float8Scaling::Tensorwise)));
  }
  EXPECT_EQ(dtrain::float8_settings(), nullptr);
}

// The GPT's blocks go through dtrain::linear; its head (tied to the
// embedding) does not.
TEST(Float8, GPTBlocksRunInFp8) {
  dtrain::models::GPTConfig config;
  config.n_embd = 32;
  config.n_head = 2;
  torch::manual_seed(5);
  dtrain::models::GPT gpt(config);
  const auto tokens = torch::randint(0, 256, {2, 16});
  const auto plain = gpt->forward(tokens);
  Float8Settings settings;
  settings.scaling = Float8Scaling::Rowwise;
  settings.min_width = 0;
  dtrain::Float8Scope scope(settings);
  const auto fp8 = gpt->forward(tokens);
  EXPECT_FALSE(torch::equal(fp8, plain));
  EXPECT_LT(((fp8 - plain).norm() / plain.norm()).item<float>(), 0.05);
}

}  // namespace
