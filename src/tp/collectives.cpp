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

// The ranks' x concatenated along `dim`, in rank order (every rank's x has
// the same shape).
torch::Tensor gathered(const torch::Tensor& x, int64_t dim, const CommPtr& group) {
  const int64_t size = group->size();
  // Along dim 0, the ranks' pieces concatenate as the flat all-gather lays them out.
  torch::Tensor piece = x.movedim(dim, 0).contiguous();
  torch::Tensor stacked = torch::empty({size * piece.numel()}, piece.options());
  group->blocking().all_gather(piece.view({-1}), stacked);
  std::vector<int64_t> shape(piece.sizes().begin(), piece.sizes().end());
  shape[0] *= size;
  return stacked.view(shape).movedim(0, dim);
}

void check_splits(const torch::Tensor& x, int64_t dim, const CommPtr& group) {
  const int64_t n = x.size(dim), size = group->size();
  if (n % size != 0)
    throw std::invalid_argument("tensor parallel: dimension " + std::to_string(dim) + " (" + std::to_string(n) +
                                ") does not split evenly across " + std::to_string(size) + " ranks");
}

// This rank's slice along `dim`.
torch::Tensor sliced(const torch::Tensor& x, int64_t dim, const CommPtr& group) {
  check_splits(x, dim, group);
  const int64_t piece = x.size(dim) / group->size();
  return x.narrow(dim, group->rank() * piece, piece).contiguous();
}

// The ranks' x summed, and of the sum this rank's slice along `dim`.
torch::Tensor reduce_scattered(const torch::Tensor& x, int64_t dim, const CommPtr& group) {
  check_splits(x, dim, group);
  torch::Tensor full = x.movedim(dim, 0).contiguous();  // rank r's slice: rows [r*n/size, (r+1)*n/size)
  std::vector<int64_t> shape(full.sizes().begin(), full.sizes().end());
  shape[0] /= group->size();
  torch::Tensor mine = torch::empty(shape, full.options());
  group->blocking().reduce_scatter(full.view({-1}), mine.view({-1}), ReduceOp::Sum);
  return mine.movedim(0, dim);
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

// Forward: gathered along `dim`. Backward: this rank's slice of the gradient,
// or with `reduce` its slice of the gradients summed over the ranks (the
// gathered value fed every rank's computation: sequence parallelism).
struct GatherDim : torch::autograd::Function<GatherDim> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t dim, bool reduce, CommPtr group) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["reduce"] = reduce;
    return gathered(x, dim, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const CommPtr group = saved_group(ctx);
    torch::Tensor grad = ctx->saved_data["reduce"].toBool() ? reduce_scattered(grads[0], dim, group)
                                                            : sliced(grads[0], dim, group);
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Forward: this rank's slice along `dim`, of x itself or with `reduce` of the
// ranks' x summed. Backward: the gradients gathered.
struct ScatterDim : torch::autograd::Function<ScatterDim> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t dim, bool reduce, CommPtr group) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    return reduce ? reduce_scattered(x, dim, group) : sliced(x, dim, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {gathered(grads[0], ctx->saved_data["dim"].toInt(), saved_group(ctx)), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
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
  return group->size() == 1 ? x : GatherDim::apply(x, x.dim() - 1, false, group);
}

torch::Tensor split_last_dim(const torch::Tensor& x, const CommPtr& group) {
  return group->size() == 1 ? x : ScatterDim::apply(x, x.dim() - 1, false, group);
}

torch::Tensor gather_sequence(const torch::Tensor& x, const CommPtr& group) {
  if (group->size() == 1) return x;
  // The gather lays the sequence out outermost; the [B, T, C] view of it is
  // strided. Made contiguous once here: each matrix product over a strided
  // input copies it and keeps its copy for backward, and TPLlama's q, k and
  // v projections (and gate and up) share one input, which would then be
  // kept three times (twice).
  return GatherDim::apply(x, int64_t{1}, true, group).contiguous();
}

torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, const CommPtr& group) {
  return group->size() == 1 ? x : ScatterDim::apply(x, int64_t{1}, true, group);
}

torch::Tensor split_sequence(const torch::Tensor& x, const CommPtr& group) {
  return group->size() == 1 ? x : ScatterDim::apply(x, int64_t{1}, false, group);
}

torch::Tensor gather_sequence_replicated(const torch::Tensor& x, const CommPtr& group) {
  return group->size() == 1 ? x : GatherDim::apply(x, int64_t{1}, false, group).contiguous();
}

}  // namespace dtrain::tp
