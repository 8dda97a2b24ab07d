// DDP's mixed precision: the parameters compute in a narrow dtype while the
// optimizer updates full-precision master weights.
//
// Note [DDP mixed precision]
// At rest (and whenever user code sees the module: optimizer step,
// checkpoints, gradient clipping) every parameter holds its fp32 master
// weights and an fp32 gradient. Before a forward, swap_in() points each
// floating parameter at a compute copy in param_dtype, cast afresh from the
// master (so whatever changed the master since, an optimizer step or a
// checkpoint load, is what computes). Forward and backward then run in
// param_dtype; AccumulateGrad makes param_dtype gradients, which the
// reducer copies into its buckets (reduce_dtype, fp32 by default) and
// averages there. At the end of backward swap_out() points every parameter
// back at its master and drops the narrow gradients, and the reducer makes
// the averages the fp32 .grad. A forward without backward (grad mode off:
// evaluation, sampling) swaps out as soon as it returns.
//
// The swap is Variable::set_data, so every handle on a parameter (the
// optimizer's, the module's, the user's) sees the same change; autograd
// keeps the post-accumulate-grad hooks across it (they live on the
// parameter, not on its gradient accumulator). Under no_sync() nothing
// reduces, so the parameters stay in param_dtype between the steps; each
// step's narrow gradient is added, as it arrives, to a sum in the master's
// dtype (accumulate()) and dropped, so that gradient accumulation over many
// no_sync() steps rounds as often as FSDP's, in fp32, not once per step in
// bf16. The next synchronised backward adds that sum to its own gradient
// before the reducer copies it into its bucket (take_accumulated()). The sums
// are the pending no_sync() steps' gradients: like .grad they last until
// that backward, and zero_grad() between no_sync() steps does not reach them.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/types.h>

#include <unordered_map>
#include <vector>

namespace dtrain::detail {

class ComputeCopies {
 public:
  // The floating parameters among `parameters`, computed in `dtype`.
  ComputeCopies(const std::vector<torch::Tensor>& parameters, c10::ScalarType dtype);

  // Points every parameter at its compute copy, cast from its master.
  void swap_in();
  // Points every parameter back at its master; gradients in the compute
  // dtype are dropped (the reducer's averages replace them).
  void swap_out();
  bool swapped() const { return swapped_; }
  c10::ScalarType dtype() const { return dtype_; }

  // Under no_sync(): adds `parameter`'s compute-dtype gradient to its sum in
  // the master's dtype and drops it (nothing for a parameter not copied).
  void accumulate(torch::Tensor parameter);
  // The sum of `parameter`'s no_sync() gradients (undefined: none), handed
  // over and forgotten.
  torch::Tensor take_accumulated(const torch::Tensor& parameter);
  bool has_accumulated(const torch::Tensor& parameter) const;

 private:
  // Index of a copied parameter in parameters_ (-1: not copied).
  int index_of(const torch::Tensor& parameter) const;

  std::vector<torch::Tensor> parameters_;
  std::vector<torch::Tensor> masters_;  // while swapped: each parameter's full-precision data
  std::vector<torch::Tensor> copies_;   // compute-dtype buffers, kept across steps
  std::vector<torch::Tensor> accumulated_;  // no_sync() steps' gradients, summed in the master's dtype
  std::unordered_map<const c10::TensorImpl*, int> index_;
  c10::ScalarType dtype_;
  bool swapped_ = false;
};

}  // namespace dtrain::detail
