#include "ddp/compute_copies.h"

#include <torch/utils.h>

#include <utility>

namespace dtrain::detail {

ComputeCopies::ComputeCopies(const std::vector<torch::Tensor>& parameters, c10::ScalarType dtype) : dtype_(dtype) {
  for (const auto& parameter : parameters)
    if (parameter.is_floating_point() && parameter.scalar_type() != dtype) parameters_.push_back(parameter);
  masters_.resize(parameters_.size());
  copies_.resize(parameters_.size());
  accumulated_.resize(parameters_.size());
  for (size_t i = 0; i < parameters_.size(); ++i) index_[parameters_[i].unsafeGetTensorImpl()] = static_cast<int>(i);
}

int ComputeCopies::index_of(const torch::Tensor& parameter) const {
  const auto it = index_.find(parameter.unsafeGetTensorImpl());
  return it == index_.end() ? -1 : it->second;
}

void ComputeCopies::accumulate(torch::Tensor parameter) {  // a handle: its .grad is the parameter's
  const int i = index_of(parameter);
  if (i < 0 || !swapped_) return;
  auto& grad = parameter.mutable_grad();
  if (!grad.defined()) return;
  torch::NoGradGuard no_grad;
  auto& sum = accumulated_[static_cast<size_t>(i)];
  if (sum.defined()) {
    sum.add_(grad);
  } else {
    sum = grad.to(masters_[static_cast<size_t>(i)].scalar_type());
  }
  grad = torch::Tensor();
}

torch::Tensor ComputeCopies::take_accumulated(const torch::Tensor& parameter) {
  const int i = index_of(parameter);
  if (i < 0) return {};
  return std::exchange(accumulated_[static_cast<size_t>(i)], torch::Tensor());
}

bool ComputeCopies::has_accumulated(const torch::Tensor& parameter) const {
  const int i = index_of(parameter);
  return i >= 0 && accumulated_[static_cast<size_t>(i)].defined();
}

void ComputeCopies::swap_in() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto& parameter = parameters_[i];
    // Already swapped (a forward under no_sync, or one whose backward never
    // ran): the master is the one captured then.
    if (!swapped_) masters_[i] = parameter.variable_data();
    if (!copies_[i].defined() || copies_[i].sizes() != masters_[i].sizes() ||
        copies_[i].device() != masters_[i].device())
      copies_[i] = torch::empty_like(masters_[i], masters_[i].options().dtype(dtype_));
    copies_[i].copy_(masters_[i]);
    if (!swapped_) parameter.set_data(copies_[i]);
  }
  swapped_ = true;
}

void ComputeCopies::swap_out() {
  if (!swapped_) return;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto& parameter = parameters_[i];
    parameter.set_data(masters_[i]);
    masters_[i] = torch::Tensor();
    auto& grad = parameter.mutable_grad();
    if (grad.defined() && grad.scalar_type() != parameter.scalar_type()) grad = torch::Tensor();
  }
  swapped_ = false;
}

}  // namespace dtrain::detail
