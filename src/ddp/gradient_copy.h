// Moving gradients between .grad and bucket slots with as few copies, and
// as few copy calls, as possible.
//
// With gradient_as_bucket_view a parameter's .grad is its slot, and
// backward accumulates straight into the bucket: nothing to copy. A copy is
// needed only for a gradient that is not the slot: a fresh tensor that
// AccumulateGrad made because .grad was undefined (zero_grad() with its
// default set_to_none), one the user assigned, or any gradient without
// views. Such gradients are staged when their hook fires and copied into the
// bucket together when it is complete: one cat into the buffer when every
// slot needs one (the usual case after zero_grad()), else one foreach copy.
#pragma once

#include "ddp/buckets.h"

#include <torch/types.h>

#include <vector>

namespace dtrain::detail {

// Can `grad` stand in for `slot` as a parameter's .grad? Same dtype, device
// and shape, dense and contiguous (the layout AccumulateGrad gives a
// contiguous parameter's gradient). Otherwise DDP copies in and out.
bool can_be_slot(const torch::Tensor& grad, const torch::Tensor& slot);

// Records that `grad` must be copied into `bucket`'s slot `position`.
void stage(Bucket& bucket, int position, torch::Tensor grad);

// Copies the staged gradients of a complete bucket into its slots, in one
// call, and forgets them. Returns the positions that were copied.
std::vector<int> copy_staged(Bucket& bucket);

// dst[k].copy_(src[k]) for every k, in one call.
void copy_all(const std::vector<torch::Tensor>& dst, const std::vector<torch::Tensor>& src);

}  // namespace dtrain::detail
