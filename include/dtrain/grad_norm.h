// Clipping gradients by their global norm, over replicated or sharded
// gradients: the arithmetic DDP's and FSDP's clip_grad_norm share (ddp.h,
// fsdp.h), as torch::nn::utils::clip_grad_norm_ does on one process.
#pragma once

#include <dtrain/comm.h>

#include <torch/types.h>

#include <vector>

namespace dtrain {

// Clips the gradients of `parameters` whose gradients are split across
// `shards_across` (each rank holds a disjoint part, as under FSDP): one
// all-reduce of the local sum of |g|^p (max for infinity). With
// shards_across == nullptr the gradients are taken as replicated (DDP, single
// process). Returns the total norm before clipping; norm_type may be infinity.
double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm, double norm_type,
                      Communicator* shards_across);

}  // namespace dtrain
