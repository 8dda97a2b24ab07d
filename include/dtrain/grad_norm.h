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

// Clips by the global 2-norm of a model that several groups of ranks hold
// together (tensor- and pipeline-parallel parts): parameter i's squared
// gradient norm counts with weights[i] (1: only this rank holds it; 1/n: one
// of n equal copies in a group summed over; 0: a copy another rank counts),
// and the weighted sums are added over each communicator of `sum_over` in
// turn (nullptr entries are skipped). Every gradient is scaled, counted or
// not, so that copies stay equal. Returns the norm before clipping.
double clip_grad_norm_of_parts(const std::vector<torch::Tensor>& parameters, const std::vector<double>& weights,
                               double max_norm, const std::vector<Communicator*>& sum_over);

}  // namespace dtrain
