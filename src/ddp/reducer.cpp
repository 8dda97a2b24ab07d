#include "ddp/reducer.h"

#include "common/tensor_alias.h"
#include "ddp/bucket_assignment.h"

#include <dtrain/trace.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <chrono>
#include <stdexcept>

namespace dtrain::detail {
namespace {

// Runs after AccumulateGrad has written a parameter's gradient for this
// backward pass (the slot Python's register_post_accumulate_grad_hook uses).
class GradientReadyHook : public torch::autograd::PostAccumulateGradHook {
 public:
  GradientReadyHook(Reducer* reducer, int parameter) : reducer_(reducer), parameter_(parameter) {}
  void operator()(const torch::autograd::Variable& /*tensor*/) override { reducer_->on_gradient_ready(parameter_); }
  const Reducer* owner() const { return reducer_; }

 private:
  Reducer* reducer_;
  int parameter_;
};

bool is_view_of(const torch::Tensor& grad, const torch::Tensor& slot) {
  return grad.defined() && grad.data_ptr() == slot.data_ptr() && grad.sizes() == slot.sizes() &&
         grad.strides() == slot.strides();
}

std::string list_names(const std::vector<std::string>& names, size_t shown) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < shown; ++i) text += (i ? ", " : "") + names[i];
  if (names.size() > shown) text += " and " + std::to_string(names.size() - shown) + " more";
  return text;
}

}  // namespace

Reducer::Reducer(std::vector<std::string> names, std::vector<torch::Tensor> parameters, CommPtr comm,
                 const DDPOptions& options)
    : names_(std::move(names)),
      parameters_(std::move(parameters)),
      comm_(std::move(comm)),
      options_(options),
      hook_(options.comm_hook ? options.comm_hook : hooks::allreduce()) {
  slots_.resize(parameters_.size());
  for (auto& members : assign_buckets(parameters_, options_.bucket_cap_bytes, options_.first_bucket_cap_bytes)) {
    Bucket bucket;
    bucket.grads.index = static_cast<int>(buckets_.size());
    int64_t total = 0;
    for (int p : members) total += parameters_[p].numel();
    bucket.grads.buffer = torch::zeros({total}, parameters_[members.front()].options().requires_grad(false));
    int64_t offset = 0;
    for (size_t position = 0; position < members.size(); ++position) {
      const auto& param = parameters_[members[position]];
      bucket.grads.gradients.push_back(alias_of(bucket.grads.buffer, offset, param.sizes()));
      bucket.grads.names.push_back(names_[members[position]]);
      slots_[members[position]] = Slot{bucket.grads.index, static_cast<int>(position)};
      offset += param.numel();
    }
    bucket.members = std::move(members);
    buckets_.push_back(std::move(bucket));
  }
  reset_iteration();
  install_hooks();
}

Reducer::~Reducer() { remove_hooks(); }

void Reducer::install_hooks() {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (torch::autograd::impl::post_acc_grad_hooks(parameters_[i])) {
      remove_hooks();
      throw std::invalid_argument("DDP: parameter '" + names_[i] +
                                  "' already has a post-accumulate-grad hook; is the model already wrapped by "
                                  "DDP or FSDP? Wrap each model once.");
    }
    torch::autograd::impl::set_post_acc_grad_hooks(parameters_[i],
                                                   std::make_unique<GradientReadyHook>(this, static_cast<int>(i)));
  }
}

void Reducer::remove_hooks() {
  for (auto& param : parameters_) {
    auto& hook = torch::autograd::impl::post_acc_grad_hooks(param);
    const auto* ours = dynamic_cast<const GradientReadyHook*>(hook.get());
    if (ours && ours->owner() == this) hook.reset();
  }
}

torch::Tensor& Reducer::slot_view(int parameter) {
  const auto& slot = slots_[parameter];
  return buckets_[slot.bucket].grads.gradients[slot.position];
}

void Reducer::copy_gradient_into_slot(int parameter) {
  torch::NoGradGuard no_grad;
  auto& grad = parameters_[parameter].mutable_grad();
  auto& slot = slot_view(parameter);
  if (!grad.defined()) {
    slot.zero_();
    return;
  }
  if (grad.is_sparse()) {
    throw std::invalid_argument("DDP: parameter '" + names_[parameter] +
                                "' has a sparse gradient, which DDP does not reduce; use a dense layer (e.g. "
                                "Embedding without sparse=true).");
  }
  if (is_view_of(grad, slot)) return;
  slot.copy_(grad);
  // Free the separate gradient now rather than after backward.
  if (options_.gradient_as_bucket_view) grad = slot;
}

void Reducer::on_gradient_ready(int parameter) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sync_) return;
  if (!finalize_queued_) {
    finalize_queued_ = true;
    backward_started_ns_ = trace::enabled() ? trace::now_ns() : -1;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize_backward(); });
  }
  if (ready_[parameter]) {
    throw std::logic_error("DDP: parameter '" + names_[parameter] +
                           "' received its gradient twice in one backward pass (its hook fired twice).");
  }
  copy_gradient_into_slot(parameter);
  ready_[parameter] = 1;
  used_[parameter] = 1;
  if (--buckets_[slots_[parameter].bucket].missing == 0) launch_complete_buckets();
}

void Reducer::launch_complete_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].missing == 0) {
    auto& bucket = buckets_[next_bucket_++];
    trace::instant("bucket_ready", "ddp", {{"bucket", bucket.grads.index}});
    const trace::Label label("bucket", bucket.grads.index);
    HookContext context{*comm_, iteration_, 0};
    bucket.reduction = hook_->reduce(bucket.grads, context);
    bytes_this_step_ += context.bytes_sent;
  }
}

void Reducer::account_for_missing_gradients() {
  std::vector<int> missing;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!ready_[i]) missing.push_back(static_cast<int>(i));
  }
  if (missing.empty()) return;
  if (!options_.find_unused_parameters) {
    std::vector<std::string> names;
    for (int p : missing) names.push_back(names_[p]);
    throw std::runtime_error(
        "DDP: " + std::to_string(missing.size()) + " parameter(s) got no gradient in this backward pass: " +
        list_names(names, 5) +
        ". If parts of the model are unused in some steps, construct DDP with "
        "DDPOptions::find_unused_parameters = true; if they never train, set requires_grad(false) on them "
        "before wrapping.");
  }
  for (int p : missing) {
    // A gradient left from no_sync() steps still counts; otherwise this
    // rank contributes zeros.
    const bool has_gradient = parameters_[p].grad().defined();
    copy_gradient_into_slot(p);
    ready_[p] = 1;
    used_[p] = has_gradient ? 1 : 0;
    --buckets_[slots_[p].bucket].missing;
  }
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  struct ResetOnExit {
    Reducer* self;
    ~ResetOnExit() { self->reset_iteration(); }
  } reset{this};

  account_for_missing_gradients();
  launch_complete_buckets();

  torch::Tensor used_anywhere;
  WorkPtr used_reduction;
  if (options_.find_unused_parameters) {
    used_anywhere = torch::tensor(used_, torch::kInt32);
    if (comm_->size() > 1) {
      used_reduction = comm_->all_reduce(used_anywhere, ReduceOp::Sum);
      bytes_this_step_ += used_anywhere.numel() * 4;
    }
  }

  const auto wait_start = std::chrono::steady_clock::now();
  for (auto& bucket : buckets_) {
    bucket.reduction->wait();
    bucket.reduction.reset();
  }
  if (used_reduction) used_reduction->wait();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();

  write_back_gradients(used_anywhere);
  ++iteration_;
  last_ = DDPStepStats{iteration_, bytes_this_step_, static_cast<int64_t>(buckets_.size()), waited};
  trace::complete("ddp_backward", trace::category::compute, backward_started_ns_,
                  {{"buckets", static_cast<int64_t>(buckets_.size())}});
  trace::sample_memory();
}

void Reducer::write_back_gradients(const torch::Tensor& used_anywhere) {
  torch::NoGradGuard no_grad;
  const int32_t* used = used_anywhere.defined() ? used_anywhere.data_ptr<int32_t>() : nullptr;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    // Unused on every rank: the gradient stays as it was (usually undefined),
    // exactly as in single-process training.
    if (used && used[i] == 0) continue;
    auto& grad = parameters_[i].mutable_grad();
    const auto& slot = slot_view(static_cast<int>(i));
    if (options_.gradient_as_bucket_view) {
      if (!is_view_of(grad, slot)) grad = slot;
    } else if (grad.defined()) {
      grad.copy_(slot);
    } else {
      grad = slot.clone();
    }
  }
}

void Reducer::reset_iteration() {
  finalize_queued_ = false;
  ready_.assign(parameters_.size(), 0);
  used_.assign(parameters_.size(), 0);
  next_bucket_ = 0;
  bytes_this_step_ = 0;
  for (auto& bucket : buckets_) {
    bucket.missing = static_cast<int>(bucket.members.size());
    bucket.reduction.reset();
  }
}

void Reducer::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  sync_ = sync;
}

bool Reducer::sync() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sync_;
}

DDPStepStats Reducer::last_step() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_;
}

std::vector<std::vector<std::string>> Reducer::bucket_layout() const {
  std::vector<std::vector<std::string>> layout;
  for (const auto& bucket : buckets_) layout.push_back(bucket.grads.names);
  return layout;
}

}  // namespace dtrain::detail
