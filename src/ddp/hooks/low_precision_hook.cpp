// bf16 / fp16 compression: half the bytes of an fp32 all-reduce.
#include <dtrain/comm_hooks.h>

#include <torch/types.h>
#include <torch/utils.h>

namespace dtrain::hooks {
namespace {

class CastBack : public PendingReduction {
 public:
  CastBack(WorkPtr work, torch::Tensor compressed, torch::Tensor bucket)
      : work_(std::move(work)), compressed_(std::move(compressed)), bucket_(std::move(bucket)) {}
  void wait() override {
    work_->wait();
    torch::NoGradGuard no_grad;
    bucket_.copy_(compressed_);
  }

 private:
  WorkPtr work_;
  torch::Tensor compressed_;
  torch::Tensor bucket_;
};

class LowPrecisionHook : public CommHook {
 public:
  explicit LowPrecisionHook(torch::ScalarType dtype) : dtype_(dtype) {}
  std::string name() const override { return dtype_ == torch::kBFloat16 ? "bf16" : "fp16"; }

  std::unique_ptr<PendingReduction> reduce(GradBucket& bucket, HookContext& ctx) override {
    torch::NoGradGuard no_grad;
    // Dividing first keeps the fp16 sum in range (fp16 overflows at 65504).
    auto compressed = bucket.buffer.div(ctx.comm.size()).to(dtype_);
    ctx.bytes_sent += compressed.numel() * static_cast<int64_t>(compressed.element_size());
    auto work = ctx.comm.all_reduce(compressed, ReduceOp::Sum);
    return std::make_unique<CastBack>(std::move(work), compressed, bucket.buffer);
  }

 private:
  torch::ScalarType dtype_;
};

}  // namespace

CommHookPtr bf16_compress() { return std::make_shared<LowPrecisionHook>(torch::kBFloat16); }
CommHookPtr fp16_compress() { return std::make_shared<LowPrecisionHook>(torch::kHalf); }

}  // namespace dtrain::hooks
