// The default hook: an exact all-reduce (average) of the bucket.
#include <dtrain/comm_hooks.h>

#include <stdexcept>

namespace dtrain::hooks {
namespace {

class WaitFor : public PendingReduction {
 public:
  explicit WaitFor(WorkPtr work) : work_(std::move(work)) {}
  void wait() override { work_->wait(); }

 private:
  WorkPtr work_;
};

class AllReduceHook : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  std::unique_ptr<PendingReduction> reduce(GradBucket& bucket, HookContext& ctx) override { return average(bucket, ctx); }
};

}  // namespace

std::unique_ptr<PendingReduction> average(GradBucket& bucket, HookContext& ctx) {
  ctx.bytes_sent += bucket.buffer.numel() * static_cast<int64_t>(bucket.buffer.element_size());
  return std::make_unique<WaitFor>(ctx.comm.all_reduce(bucket.buffer, ReduceOp::Avg));
}

CommHookPtr allreduce() { return std::make_shared<AllReduceHook>(); }

CommHookPtr by_name(const std::string& name) {
  if (name == "none" || name == "allreduce") return allreduce();
  if (name == "bf16") return bf16_compress();
  if (name == "fp16") return fp16_compress();
  if (name == "powersgd") return powersgd();
  if (name == "topk") return topk();
  throw std::invalid_argument("unknown gradient compression '" + name +
                              "'; allowed: none, bf16, fp16, powersgd, topk");
}

}  // namespace dtrain::hooks
