// A cp group as the models' sequence context (dtrain/context_parallel.h,
// Note [sequence context] in dtrain/attention.h).
#include "dtrain/context_parallel.h"

namespace dtrain::cp {

ContextParallel::ContextParallel(CommPtr group, bool overlap) : ring_(make_ring(std::move(group), overlap)) {}

torch::Tensor ContextParallel::positions(int64_t local, const torch::Device& device) const {
  return shard_positions(local * size(), size(), rank(), device);
}

torch::Tensor ContextParallel::attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) const {
  return ring_attention(q, k, v, ring_);
}

ContextParallel::Scope::Scope(const ContextParallel& context) : previous_(models::sequence_context()) {
  models::set_sequence_context(&context);
}

ContextParallel::Scope::~Scope() { models::set_sequence_context(previous_); }

}  // namespace dtrain::cp
