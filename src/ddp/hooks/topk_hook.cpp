// Top-k sparsification with error feedback: each rank sends only its k
// largest-magnitude entries; what it held back is added to its next step's
// gradient, so nothing is lost, only delayed.
#include <dtrain/comm_hooks.h>

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::hooks {
namespace {

class Densify : public PendingReduction {
 public:
  Densify(torch::Tensor bucket, torch::Tensor all_indices, torch::Tensor all_values, WorkPtr gathered, int world)
      : bucket_(std::move(bucket)), all_indices_(std::move(all_indices)), all_values_(std::move(all_values)),
        gathered_(std::move(gathered)), world_(world) {}

  void wait() override {
    gathered_->wait();
    torch::NoGradGuard no_grad;
    bucket_.zero_();
    bucket_.index_add_(0, all_indices_.to(torch::kLong), all_values_);
    bucket_.div_(world_);
  }

 private:
  torch::Tensor bucket_, all_indices_, all_values_;
  WorkPtr gathered_;
  int world_;
};

class TopKHook : public CommHook {
 public:
  explicit TopKHook(TopKOptions options) : options_(options) {
    if (!(options_.ratio > 0 && options_.ratio <= 1)) {
      throw std::invalid_argument("top-k: ratio must be in (0, 1], got " + std::to_string(options_.ratio));
    }
  }
  std::string name() const override { return "topk"; }

  std::unique_ptr<PendingReduction> reduce(GradBucket& bucket, HookContext& ctx) override {
    torch::NoGradGuard no_grad;
    auto& buffer = bucket.buffer;
    const int64_t n = buffer.numel();
    if (n > std::numeric_limits<int32_t>::max()) {
      throw std::invalid_argument("top-k: bucket " + std::to_string(bucket.index) +
                                  " has more than 2^31 elements; lower DDPOptions::bucket_cap_bytes");
    }
    if (options_.error_feedback) {
      auto [it, fresh] = errors_.try_emplace(bucket.index);
      // DDP rebuilds its buckets once, after the first step
      // (DDPOptions::rebuild_buckets): a bucket with other members starts afresh.
      if (fresh || it->second.names != bucket.names) it->second = {bucket.names, torch::zeros_like(buffer)};
      buffer.add_(it->second.error);
    }
    const int64_t k = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(options_.ratio * n)), 1, n);
    auto chosen = std::get<1>(buffer.abs().topk(k, /*dim=*/0, /*largest=*/true, /*sorted=*/false));
    auto values = buffer.index_select(0, chosen);
    if (options_.error_feedback) {
      auto& error = errors_[bucket.index].error;
      error.copy_(buffer);
      error.index_fill_(0, chosen, 0);
    }
    const int world = ctx.comm.size();
    auto indices = chosen.to(torch::kInt32);
    auto all_indices = torch::empty({k * world}, indices.options());
    auto all_values = torch::empty({k * world}, values.options());
    ctx.bytes_sent += k * (4 + static_cast<int64_t>(values.element_size()));
    // Indices and values travel in one operation (Note [coalescing] in
    // src/comm/communicator.cpp): one synchronisation of the ranks, not two.
    auto gathered = ctx.comm.all_gather_coalesced({indices, values}, {all_indices, all_values});
    return std::make_unique<Densify>(buffer, all_indices, all_values, std::move(gathered), world);
  }

 private:
  TopKOptions options_;
  struct ErrorMemory {
    std::vector<std::string> names;  // the members it belongs to
    torch::Tensor error;
  };
  std::map<int, ErrorMemory> errors_;
};

}  // namespace

CommHookPtr topk(TopKOptions options) { return std::make_shared<TopKHook>(options); }

}  // namespace dtrain::hooks
