// The autograd-aware collectives of tensor parallelism (tensor_parallel.h).
// Each is a torch::autograd::Function whose context holds the group's
// communicator in a capsule, so a graph keeps its communicator alive until
// its backward has run.
#include "dtrain/tensor_parallel.h"

#include <torch/autograd.h>
#include <torch/custom_class.h>

#include <stdexcept>

namespace dtrain::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(CommPtr comm) : group(std::move(comm)) {}
  CommPtr group;
};

void save_group(AutogradContext* ctx, const CommPtr& group) {
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupHolder>(group));
}

CommPtr saved_group(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["group"].toCapsule())->group;
}

torch::Tensor all_reduced(const torch::Tensor& x, const CommPtr& group) {
  torch::Tensor sum = x.contiguous().clone();
  group->blocking().all_reduce(sum, ReduceOp::Sum);
  return sum;
}

// [..., n] on every rank -> [..., size * n], the ranks' pieces in rank order.
torch::Tensor gathered_last_dim(const torch::Tensor& x, const CommPtr& group) {
  const int64_t size = group->size();
  torch::Tensor piece = x.contiguous();
  torch::Tensor stacked = torch::empty({size * piece.numel()}, piece.options());
  group->blocking().all_gather(piece.view({-1}), stacked);
  // [size, ..., n] -> [..., size, n] -> [..., size * n]
  std::vector<int64_t> shape{size};
  for (int64_t d : piece.sizes()) shape.push_back(d);
  torch::Tensor grid = stacked.view(shape).movedim(0, -2);
  std::vector<int64_t> out_shape(piece.sizes().begin(), piece.sizes().end());
  out_shape.back() *= size;
  return grid.reshape(out_shape);
}

torch::Tensor sliced_last_dim(const torch::Tensor& x, const CommPtr& group) {
  const int64_t size = group->size(), n = x.size(-1);
  if (n % size != 0)
    throw std::invalid_argument("tensor parallel: the last dimension (" + std::to_string(n) +
                                ") does not split evenly across " + std::to_string(size) + " ranks");
  return x.narrow(-1, group->rank() * (n / size), n / size).contiguous();
}

struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, CommPtr group) {
    save_group(ctx, group);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(grads[0], saved_group(ctx)), torch::Tensor()};
  }
};

struct ReduceFromGroup : torch::autograd::Function<ReduceFromGroup> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, CommPtr group) {
    return all_reduced(x, group);
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], torch::Tensor()}; }
};

struct GatherLastDim : torch::autograd::Function<GatherLastDim> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, CommPtr group) {
    save_group(ctx, group);
    return gathered_last_dim(x, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {sliced_last_dim(grads[0], saved_group(ctx)), torch::Tensor()};
  }
};

struct SplitLastDim : torch::autograd::Function<SplitLastDim> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, CommPtr group) {
    save_group(ctx, group);
    return sliced_last_dim(x, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {gathered_last_dim(grads[0], saved_group(ctx)), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor copy_to_group(const torch::Tensor& x, const CommPtr& group) {
  return group->size() == 1 ? x : CopyToGroup::apply(x, group);
}

torch::Tensor reduce_from_group(const torch::Tensor& x, const CommPtr& group) {
  return group->size() == 1 ? x : ReduceFromGroup::apply(x, group);
}

torch::Tensor gather_last_dim(const torch::Tensor& x, const CommPtr& group) {
  return group->size() == 1 ? x : GatherLastDim::apply(x, group);
}

torch::Tensor split_last_dim(const torch::Tensor& x, const CommPtr& group) {
  return group->size() == 1 ? x : SplitLastDim::apply(x, group);
}

}  // namespace dtrain::tp
