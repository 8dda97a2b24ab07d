#include "ddp/reducer.h"

#include "ddp/bucket_assignment.h"
#include "ddp/gradient_copy.h"
#include "ddp/gradient_order.h"

#include <dtrain/trace.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
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

std::string list_names(const std::vector<std::string>& names, size_t shown) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < shown; ++i) text += (i ? ", " : "") + names[i];
  if (names.size() > shown) text += " and " + std::to_string(names.size() - shown) + " more";
  return text;
}

}  // namespace

Reducer::Reducer(std::vector<std::string> names, std::vector<torch::Tensor> parameters, CommPtr comm,
                 const DDPOptions& options, ComputeCopies* compute_copies)
    : names_(std::move(names)),
      parameters_(std::move(parameters)),
      comm_(std::move(comm)),
      options_(options),
      hook_(options.comm_hook ? options.comm_hook : hooks::allreduce()),
      compute_copies_(compute_copies) {
  if (!parameters_.empty()) stream_ = CommStream(parameters_.front().device(), options_.comm_streams, "cuda all-reduce");
  if (options_.mixed_precision) bucket_dtype_ = options_.mixed_precision->reduce_dtype;
  const auto order = reverse_registration_order(parameters_.size());
  buckets_ = build_buckets(
      assign_buckets(parameters_, order, options_.bucket_cap_bytes, options_.first_bucket_cap_bytes), parameters_,
      names_, bucket_dtype_);
  for (const auto& param : parameters_) viewable_.push_back(options_.gradient_as_bucket_view && param.is_contiguous());
  buckets_rebuilt_ = !options_.rebuild_buckets;
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

void Reducer::on_gradient_ready(int parameter) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sync_) {
    // Note [DDP mixed precision]: the narrow gradient joins its full-precision sum.
    if (compute_copies_ && compute_copies_->swapped()) compute_copies_->accumulate(parameters_[parameter]);
    return;
  }
  if (!finalize_queued_) start_backward();
  if (ready_[parameter]) {
    const bool promised_unused =
        std::find(static_unused_.begin(), static_unused_.end(), parameter) != static_unused_.end();
    throw std::logic_error(
        "DDP: parameter '" + names_[parameter] +
        (promised_unused ? "' got a gradient, but it got none in the first iteration and DDPOptions::static_graph "
                           "promises the same parameters are used in every iteration."
                         : "' received its gradient twice in one backward pass (its hook fired twice)."));
  }
  if (!buckets_rebuilt_) arrival_order_.push_back(parameter);
  stage_gradient(parameter);
  mark_ready(parameter, true);
}

void Reducer::start_backward() {
  finalize_queued_ = true;
  backward_started_ns_ = trace::enabled() ? trace::now_ns() : -1;
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize_backward(); });
  // static_graph: what got no gradient in the first pass gets none now
  // either; its zeros (or no_sync sum) go in at once, not at the end.
  for (int p : static_unused_) {
    const bool has_gradient = has_gradient_to_reduce(p);
    stage_gradient(p);
    mark_ready(p, has_gradient);
  }
}

bool Reducer::has_gradient_to_reduce(int parameter) const {
  return parameters_[parameter].grad().defined() ||
         (compute_copies_ && compute_copies_->has_accumulated(parameters_[parameter]));
}

void Reducer::stage_gradient(int parameter) {
  auto& grad = parameters_[parameter].mutable_grad();
  auto& slot = buckets_.slot(parameter);
  // The no_sync() steps' sum in full precision, then this step's gradient
  // on top (Note [DDP mixed precision]); the bucket takes the sum.
  if (compute_copies_) {
    if (torch::Tensor sum = compute_copies_->take_accumulated(parameters_[parameter]); sum.defined()) {
      torch::NoGradGuard no_grad;
      if (grad.defined()) sum.add_(grad);
      grad = sum;
    }
  }
  if (!grad.defined()) {
    torch::NoGradGuard no_grad;
    slot.zero_();
    return;
  }
  if (grad.is_sparse()) {
    throw std::invalid_argument("DDP: parameter '" + names_[parameter] +
                                "' has a sparse gradient, which DDP does not reduce; use a dense layer (e.g. "
                                "Embedding without sparse=true).");
  }
  if (is_view_of(grad, slot)) return;  // backward accumulated into the bucket
  const auto& where = buckets_.slots[parameter];
  stage(buckets_.buckets[where.bucket], where.position, grad);
}

void Reducer::mark_ready(int parameter, bool used) {
  ready_[parameter] = 1;
  used_[parameter] = used ? 1 : 0;
  auto& bucket = buckets_.buckets[buckets_.slots[parameter].bucket];
  if (--bucket.missing > 0) return;
  for (int position : copy_staged(bucket)) {
    // Free the separate gradient now rather than after backward.
    const int p = bucket.members[position];
    auto& grad = parameters_[p].mutable_grad();
    const auto& slot = bucket.grads.gradients[position];
    if (viewable_[p] && can_be_slot(grad, slot)) {
      grad = slot;
    } else if (compute_copies_ && compute_copies_->swapped()) {
      grad = torch::Tensor();  // a compute-dtype gradient, now in the bucket: swap_out would drop it anyway
    }
  }
  launch_complete_buckets();
}

void Reducer::launch_complete_buckets() {
  auto& buckets = buckets_.buckets;
  while (next_bucket_ < buckets.size() && buckets[next_bucket_].missing == 0) {
    auto& bucket = buckets[next_bucket_++];
    trace::instant("bucket_ready", "ddp", {{"bucket", bucket.grads.index}});
    const trace::Label label("bucket", bucket.grads.index);
    stream_.wait_for_current();  // the bucket's gradients are written
    const CommStream::Scope on_stream(stream_);  // the hook's collectives are timed on the device there
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
    const bool has_gradient = has_gradient_to_reduce(p);
    stage_gradient(p);
    mark_ready(p, has_gradient);
  }
  if (options_.static_graph && iteration_ == 0) static_unused_ = missing;
}

torch::Tensor Reducer::parameters_used_anywhere() {
  if (options_.static_graph && static_used_anywhere_.defined()) return static_used_anywhere_;
  auto used_anywhere = torch::tensor(used_, torch::kInt32);
  if (comm_->size() > 1) {
    comm_->blocking().all_reduce(used_anywhere, ReduceOp::Sum);
    bytes_this_step_ += used_anywhere.numel() * 4;
  }
  if (options_.static_graph) static_used_anywhere_ = used_anywhere;
  return used_anywhere;
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  struct ResetOnExit {
    Reducer* self;
    ~ResetOnExit() {
      if (self->compute_copies_) self->compute_copies_->swap_out();  // also when the pass failed
      self->reset_iteration();
    }
  } reset{this};

  account_for_missing_gradients();
  launch_complete_buckets();

  const auto wait_start = std::chrono::steady_clock::now();
  // The used-map's all-reduce queues behind the buckets on the
  // communicator's thread, so waiting for it here costs no overlap.
  torch::Tensor used_anywhere;
  if (options_.find_unused_parameters) used_anywhere = parameters_used_anywhere();
  {
    // A hook finishes (decompresses, divides) on the stream it began on.
    const CommStream::Scope on_stream(stream_);
    for (auto& bucket : buckets_.buckets) {
      bucket.reduction->wait();
      bucket.reduction.reset();
    }
  }
  // Every bucket and its hook's finishing work: all the stream holds.
  stream_.current_waits();  // the averages are read on the compute stream from here on
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();

  // The masters come back before the averages become their .grad.
  if (compute_copies_) compute_copies_->swap_out();
  write_back_gradients(used_anywhere);
  if (!buckets_rebuilt_) rebuild_buckets_in_gradient_order();
  ++iteration_;
  last_ = DDPStepStats{iteration_, bytes_this_step_, static_cast<int64_t>(buckets_.buckets.size()), waited};
  trace::complete("ddp_backward", trace::category::compute, backward_started_ns_,
                  {{"buckets", static_cast<int64_t>(buckets_.buckets.size())}});
  trace::sample_memory();
}

void Reducer::write_back_gradients(const torch::Tensor& used_anywhere) {
  torch::NoGradGuard no_grad;
  const int32_t* used = used_anywhere.defined() ? used_anywhere.data_ptr<int32_t>() : nullptr;
  std::vector<torch::Tensor> copy_to, copy_from;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto& grad = parameters_[i].mutable_grad();
    if (used && used[i] == 0) {
      // Unused on every rank: the gradient stays as it was (usually
      // undefined), exactly as in single-process training.
      if (used_[i] && options_.static_graph) {
        throw std::runtime_error("DDP: parameter '" + names_[i] +
                                 "' has a gradient, but no rank used it in the first iteration and "
                                 "DDPOptions::static_graph promises the same parameters are used in every "
                                 "iteration; construct DDP without static_graph.");
      }
      continue;
    }
    const auto& slot = buckets_.slot(static_cast<int>(i));
    if (is_view_of(grad, slot)) continue;
    // A bucket in another dtype than the parameter (mixed precision's
    // reduce_dtype) cannot be its .grad: the average is cast into one.
    const bool same_dtype = slot.scalar_type() == parameters_[i].scalar_type();
    if (viewable_[i] && same_dtype && (!grad.defined() || can_be_slot(grad, slot))) {
      grad = slot;
    } else if (grad.defined()) {
      copy_to.push_back(grad);
      copy_from.push_back(slot);
    } else {
      grad = slot.to(parameters_[i].scalar_type(), /*non_blocking=*/false, /*copy=*/true);
    }
  }
  copy_all(copy_to, copy_from);
}

void Reducer::rebuild_buckets_in_gradient_order() {
  buckets_rebuilt_ = true;
  const auto order = agreed_gradient_order(*comm_, arrival_order_, parameters_.size(), bytes_this_step_);
  arrival_order_ = {};
  const auto assignment =
      assign_buckets(parameters_, order, options_.bucket_cap_bytes, options_.first_bucket_cap_bytes);
  if (assignment == buckets_.assignment()) return;
  auto rebuilt = build_buckets(assignment, parameters_, names_, bucket_dtype_);
  carry_over(buckets_, rebuilt, parameters_);
  buckets_ = std::move(rebuilt);
}

void Reducer::reset_iteration() {
  finalize_queued_ = false;
  ready_.assign(parameters_.size(), 0);
  used_.assign(parameters_.size(), 0);
  if (!buckets_rebuilt_) arrival_order_.clear();
  next_bucket_ = 0;
  bytes_this_step_ = 0;
  for (auto& bucket : buckets_.buckets) {
    bucket.missing = static_cast<int>(bucket.members.size());
    bucket.staged.assign(bucket.members.size(), torch::Tensor());
    bucket.staged_count = 0;
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
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::vector<std::string>> layout;
  for (const auto& bucket : buckets_.buckets) layout.push_back(bucket.grads.names);
  return layout;
}

}  // namespace dtrain::detail
