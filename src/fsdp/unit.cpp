#include "fsdp/unit.h"
#include "fsdp/schedule_rules.h"

#include "common/tensor_alias.h"

#include <dtrain/trace.h>

#include <torch/types.h>
#include <torch/utils.h>

#include <stdexcept>

namespace dtrain::detail {

const char* to_string(TrainingState state) {
  switch (state) {
    case TrainingState::Idle: return "idle";
    case TrainingState::Forward: return "forward";
    case TrainingState::ForwardDone: return "after forward";
    case TrainingState::PreBackward: return "backward";
    case TrainingState::PostBackward: return "after its backward";
  }
  return "?";
}

Unit::Unit(std::string name, const torch::nn::Module* module, std::vector<std::string> parameter_names,
           std::vector<torch::Tensor> parameters, UnitGroups groups, const FSDPOptions& options)
    : name_(std::move(name)),
      trace_name_(trace::intern(name_.empty() ? "(root)" : name_)),
      module_(module),
      flat_(std::move(parameter_names), std::move(parameters), groups.shard->size(), groups.shard->rank(),
            options.mixed_precision.param_dtype),
      groups_(groups),
      options_(options) {
  ready_.assign(flat_.entries().size(), 0);
  stashed_.resize(flat_.entries().size());
  for (const auto& entry : flat_.entries()) expected_gradients_ += entry.param.requires_grad() ? 1 : 0;
}

void Unit::transition(TrainingState from, TrainingState to) {
  if (state_ != from) {
    throw std::logic_error("FSDP: unit " + display_name() + " cannot go from state '" + to_string(state_) +
                           "' to '" + to_string(to) + "' (only from '" + to_string(from) + "')");
  }
  state_ = to;
}

void Unit::begin_forward() { transition(TrainingState::Idle, TrainingState::Forward); }
void Unit::end_forward() { transition(TrainingState::Forward, TrainingState::ForwardDone); }
void Unit::begin_backward() { transition(TrainingState::ForwardDone, TrainingState::PreBackward); }
void Unit::end_backward() { transition(TrainingState::PreBackward, TrainingState::PostBackward); }

bool Unit::start_unshard() {
  if (gather_work_ || flat_.using_full_views()) return false;
  if (flat_.full_is_shard()) return false;
  torch::NoGradGuard no_grad;
  flat_.allocate_full();
  gather_source_ = flat_.shard().to(options_.mixed_precision.param_dtype);
  const trace::Label label("unit", index_, trace_name_);
  gather_work_ = groups_.shard->all_gather(gather_source_, flat_.full_for_writing());
  return true;
}

void Unit::finish_unshard() {
  if (!gather_work_ && !flat_.using_full_views()) start_unshard();
  if (gather_work_) {
    gather_work_->wait();
    gather_work_.reset();
    gather_source_ = torch::Tensor();
  }
  if (!flat_.using_full_views()) flat_.use_full_views();
}

void Unit::reshard(bool free_full) {
  if (gather_work_) {  // a prefetch that was never used
    gather_work_->wait();
    gather_work_.reset();
    gather_source_ = torch::Tensor();
  }
  if (flat_.using_full_views()) flat_.use_shard_views();
  if (free_full) flat_.free_full();
}

void Unit::stash_shard_gradients() {
  auto& entries = flat_.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    auto& grad = entries[i].param.mutable_grad();
    if (grad.defined()) {
      stashed_[i] = grad;
      grad = torch::Tensor();
    }
  }
}

bool Unit::on_gradient_ready(size_t parameter) {
  if (state_ != TrainingState::PreBackward) {
    throw std::runtime_error("FSDP: unit " + display_name() + " received the gradient of parameter '" +
                             flat_.entries()[parameter].name + "' while it was " + to_string(state_) +
                             ", not gathered for backward. Its parameters were used outside the unit's call: enter "
                             "the module through dtrain::Sharded<> (or as a child of the root Sequential), or "
                             "leave it out of the wrap policy.");
  }
  if (ready_[parameter]) {
    throw std::logic_error("FSDP: parameter '" + flat_.entries()[parameter].name +
                           "' received its gradient twice in one backward pass");
  }
  ready_[parameter] = 1;
  return ++ready_count_ == expected_gradients_;
}

void Unit::reduce_gradients(bool sync) {
  torch::NoGradGuard no_grad;
  const auto reduce_dtype = options_.mixed_precision.reduce_dtype;
  auto full = torch::zeros({flat_.padded_numel()}, flat_.shard().options().dtype(reduce_dtype));
  auto& entries = flat_.entries();
  for (auto& entry : entries) {
    auto& grad = entry.param.mutable_grad();
    if (grad.defined()) {
      full.narrow(0, entry.offset, entry.numel).copy_(grad.reshape({-1}));
      grad = torch::Tensor();  // the full-size gradient is freed here
    }
  }
  if (unsynced_full_gradient_.defined()) {
    full.add_(unsynced_full_gradient_);
    unsynced_full_gradient_ = torch::Tensor();
  }
  ready_.assign(ready_.size(), 0);
  ready_count_ = 0;
  if (!sync) {
    unsynced_full_gradient_ = full;
    return;
  }
  // The unit holds `full` until backward waits for the reduction
  // (wait_reduction), not only until the operation finishes: the moment the
  // memory goes back is then the same in every run, so `dtrain plan` can
  // predict the peak to the byte.
  full_gradient_ = full;
  reduction_started_ = true;
  const trace::Label label("unit", index_, trace_name_);
  if (fsdp_rules::reduces_in_place(options_.strategy)) {
    reduce_work_ = groups_.shard->all_reduce(full_gradient_, ReduceOp::Avg);
  } else {
    shard_gradient_ = torch::empty({flat_.shard_numel()}, full.options());
    reduce_work_ = groups_.shard->reduce_scatter(full_gradient_, shard_gradient_, ReduceOp::Avg);
  }
}

void Unit::wait_reduction() {
  if (!reduce_work_) return;
  reduce_work_->wait();
  // OptimizerOnly's .grad will view the all-reduced buffer; the others only need the shard.
  if (!fsdp_rules::reduces_in_place(options_.strategy)) full_gradient_ = torch::Tensor();
}

void Unit::finish_gradients() {
  if (!reduction_started_) return;
  torch::NoGradGuard no_grad;
  reduce_work_->wait();
  reduce_work_.reset();
  if (fsdp_rules::reduces_in_place(options_.strategy)) {
    shard_gradient_ = full_gradient_.narrow(0, groups_.shard->rank() * flat_.shard_numel(), flat_.shard_numel());
  }
  full_gradient_ = torch::Tensor();
  if (groups_.replicate && groups_.replicate->size() > 1) {
    const trace::Label label("unit", index_, trace_name_);
    groups_.replicate->all_reduce(shard_gradient_, ReduceOp::Avg)->wait();
  }
  // Gradients in the master dtype, shaped like the parameters' shards.
  auto gradient = shard_gradient_.to(flat_.shard().scalar_type()).contiguous();
  shard_gradient_ = torch::Tensor();
  auto& entries = flat_.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!entries[i].param.requires_grad()) continue;
    // Not a view: Optimizer::zero_grad() detaches gradients in place.
    auto piece = alias_of(gradient, flat_.local_offset(i), {flat_.entries()[i].local_count});
    if (stashed_[i].defined()) {
      piece = piece + stashed_[i];
      stashed_[i] = torch::Tensor();
    }
    entries[i].param.mutable_grad() = piece;
  }
  reduction_started_ = false;
}

}  // namespace dtrain::detail
