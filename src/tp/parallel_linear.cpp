// Column- and row-parallel linear layers (tensor_parallel.h).
#include "dtrain/tensor_parallel.h"

#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>
#include <torch/utils.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace dtrain::tp {
namespace {

void check_divides(int64_t count, int64_t size, const std::string& what) {
  if (size < 1 || count % size != 0)
    throw std::invalid_argument("tensor parallel: " + what + " (" + std::to_string(count) +
                                ") does not split evenly across " + std::to_string(size) + " ranks");
}

// torch::nn::Linear's initialisation of a full [out, in] layer, drawn from
// the default generator in the same order (weight, then bias), so that every
// group size slices the same numbers.
std::pair<torch::Tensor, torch::Tensor> linear_init(int64_t in, int64_t out, bool bias) {
  torch::NoGradGuard no_grad;
  torch::Tensor weight = torch::empty({out, in});
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  torch::Tensor b;
  if (bias) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    b = torch::empty({out});
    torch::nn::init::uniform_(b, -bound, bound);
  }
  return {weight, b};
}

void copy_into(torch::Tensor& parameter, const torch::Tensor& value, const std::string& name) {
  if (!parameter.sizes().equals(value.sizes()))
    throw std::invalid_argument("tensor parallel: " + name + " slice has shape " + c10::str(value.sizes()) +
                                ", the layer's is " + c10::str(parameter.sizes()));
  torch::NoGradGuard no_grad;
  parameter.copy_(value);
}

}  // namespace

torch::Tensor column_slice(const torch::Tensor& full, int rank, int size, int64_t sections) {
  check_divides(full.size(0), sections, "the output features' sections");
  const int64_t section = full.size(0) / sections;
  check_divides(section, size, "a section of the output features");
  const int64_t piece = section / size;
  std::vector<torch::Tensor> pieces;
  for (int64_t s = 0; s < sections; ++s) pieces.push_back(full.narrow(0, s * section + rank * piece, piece));
  return torch::cat(pieces, 0);
}

torch::Tensor row_slice(const torch::Tensor& full, int rank, int size) {
  check_divides(full.size(1), size, "the input features");
  const int64_t piece = full.size(1) / size;
  return full.narrow(1, rank * piece, piece).contiguous();
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in_features, int64_t out_features, CommPtr group,
                                                   ColumnParallelLinearOptions options)
    : in_features_(in_features), out_features_(out_features), group_(std::move(group)), options_(options) {
  check_divides(out_features_, options_.sections * group_->size(), "the output features");
  const int64_t local = out_features_ / group_->size();
  weight = register_parameter("weight", torch::empty({local, in_features_}));
  if (options_.bias) bias = register_parameter("bias", torch::zeros({local}));
  const auto [full_weight, full_bias] = linear_init(in_features_, out_features_, options_.bias);
  load_full(full_weight, full_bias);
}

void ColumnParallelLinearImpl::load_full(const torch::Tensor& full_weight, const torch::Tensor& full_bias) {
  const int rank = group_->rank(), size = group_->size();
  copy_into(weight, column_slice(full_weight, rank, size, options_.sections), "weight");
  if (bias.defined() && full_bias.defined())
    copy_into(bias, column_slice(full_bias.unsqueeze(1), rank, size, options_.sections).squeeze(1), "bias");
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) { return forward_gathered(copy_to_group(x, group_)); }

torch::Tensor ColumnParallelLinearImpl::forward_gathered(const torch::Tensor& x) {
  torch::Tensor y = torch::nn::functional::linear(x, weight, bias);
  return options_.gather_output ? gather_last_dim(y, group_) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in_features, int64_t out_features, CommPtr group,
                                             RowParallelLinearOptions options)
    : in_features_(in_features), out_features_(out_features), group_(std::move(group)), options_(options) {
  check_divides(in_features_, group_->size(), "the input features");
  weight = register_parameter("weight", torch::empty({out_features_, in_features_ / group_->size()}));
  if (options_.bias) bias = register_parameter("bias", torch::zeros({out_features_}));
  const auto [full_weight, full_bias] = linear_init(in_features_, out_features_, options_.bias);
  load_full(full_weight, full_bias);
}

void RowParallelLinearImpl::load_full(const torch::Tensor& full_weight, const torch::Tensor& full_bias) {
  copy_into(weight, row_slice(full_weight, group_->rank(), group_->size()), "weight");
  if (bias.defined() && full_bias.defined()) copy_into(bias, full_bias, "bias");
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  const torch::Tensor input = options_.input_is_parallel ? x : split_last_dim(x, group_);
  // The bias is added once, after the partial products are summed.
  torch::Tensor y = reduce_from_group(torch::nn::functional::linear(input, weight), group_);
  return bias.defined() ? y + bias : y;
}

torch::Tensor RowParallelLinearImpl::forward_sequence_parallel(const torch::Tensor& x) {
  torch::Tensor y = reduce_scatter_sequence(torch::nn::functional::linear(x, weight), group_);
  return bias.defined() ? y + copy_to_group(bias, group_) : y;
}

}  // namespace dtrain::tp
