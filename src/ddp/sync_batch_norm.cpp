#include <dtrain/sync_batch_norm.h>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <stdexcept>

namespace dtrain {
namespace {

// Sum over ranks, differentiable: the gradient of every rank's copy of the
// sum flows back to every rank's input, so the gradient is itself a sum.
class AllReduceSum : public torch::autograd::Function<AllReduceSum> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               Communicator* comm) {
    ctx->saved_data["comm"] = reinterpret_cast<int64_t>(comm);
    auto total = input.clone();
    comm->blocking().all_reduce(total, ReduceOp::Sum);
    return total;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* comm = reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
    auto total = grads[0].contiguous().clone();
    comm->blocking().all_reduce(total, ReduceOp::Sum);
    return {total, torch::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(int64_t num_features, CommPtr comm)
    : SyncBatchNormImpl(SyncBatchNormOptions{num_features}, std::move(comm)) {}

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options_, CommPtr comm)
    : options(options_), comm_(std::move(comm)) {
  if (options.num_features <= 0) throw std::invalid_argument("SyncBatchNorm: num_features must be positive");
  reset();
}

void SyncBatchNormImpl::reset() {
  if (options.affine) {
    weight = register_parameter("weight", torch::ones({options.num_features}));
    bias = register_parameter("bias", torch::zeros({options.num_features}));
  }
  running_mean = register_buffer("running_mean", torch::zeros({options.num_features}));
  running_var = register_buffer("running_var", torch::ones({options.num_features}));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kLong));
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& x) {
  if (x.dim() < 2 || x.size(1) != options.num_features) {
    throw std::invalid_argument("SyncBatchNorm: expected input [N, " + std::to_string(options.num_features) +
                                ", ...], got " + c10::str(x.sizes()));
  }
  const bool distributed = is_training() && comm_ && (comm_->size() > 1 || multi_rank_path_);
  if (!distributed) {
    if (is_training()) num_batches_tracked.add_(1);
    return torch::batch_norm(x, weight, bias, running_mean, running_var, is_training(), options.momentum,
                             options.eps, /*cudnn_enabled=*/true);
  }

  std::vector<int64_t> reduce_dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) reduce_dims.push_back(d);
  std::vector<int64_t> stat_shape(static_cast<size_t>(x.dim()), 1);
  stat_shape[1] = options.num_features;

  // Global mean, then the global sum of squared deviations from it (two
  // passes: as accurate as the single-process kernel, unlike E[x^2]-E[x]^2).
  const double local_count = static_cast<double>(x.numel() / options.num_features);
  auto count = torch::full({1}, local_count, x.options().requires_grad(false));
  auto sums = AllReduceSum::apply(torch::cat({x.sum(reduce_dims), count}), comm_.get());
  const double global_count = sums[-1].item<double>();
  auto mean = sums.narrow(0, 0, options.num_features) / global_count;
  auto centered = x - mean.view(stat_shape);
  auto squares = AllReduceSum::apply(centered.pow(2).sum(reduce_dims), comm_.get());
  auto variance = squares / global_count;

  auto y = centered * torch::rsqrt(variance + options.eps).view(stat_shape);
  if (options.affine) y = y * weight.view(stat_shape) + bias.view(stat_shape);

  torch::NoGradGuard no_grad;
  const double unbiased = global_count > 1 ? global_count / (global_count - 1) : 1.0;
  running_mean.mul_(1 - options.momentum).add_(mean.detach(), options.momentum);
  running_var.mul_(1 - options.momentum).add_(variance.detach() * unbiased, options.momentum);
  num_batches_tracked.add_(1);
  return y;
}

void set_sync_batch_norm_comm(torch::nn::Module& module, const CommPtr& comm) {
  for (const auto& child : module.modules(/*include_self=*/true)) {
    if (auto* sync = child->as<SyncBatchNormImpl>()) sync->set_comm(comm);
  }
}

}  // namespace dtrain
