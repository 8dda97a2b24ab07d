// The vocabulary-parallel embedding and cross-entropy (tensor_parallel.h).
//
// Both are written with ordinary autograd operations around
// reduce_from_group: every rank holds the same (replicated) loss and runs
// backward on it, so the identity backward of reduce_from_group hands each
// rank exactly the gradient of its own part of the sum.
#include "dtrain/tensor_parallel.h"

#include <torch/nn/functional/embedding.h>
#include <torch/nn/init.h>

#include <stdexcept>
#include <string>

namespace dtrain::tp {
namespace {

int64_t rows_per_rank(int64_t vocab_size, int size) {
  if (vocab_size % size != 0)
    throw std::invalid_argument("tensor parallel: the vocabulary (" + std::to_string(vocab_size) +
                                " tokens) does not split evenly across " + std::to_string(size) + " ranks");
  return vocab_size / size;
}

}  // namespace

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t vocab_size, int64_t dim, CommPtr group)
    : vocab_size_(vocab_size), dim_(dim), group_(std::move(group)) {
  const int64_t rows = rows_per_rank(vocab_size_, group_->size());
  first_ = group_->rank() * rows;
  weight = register_parameter("weight", torch::empty({rows, dim_}));
  torch::NoGradGuard no_grad;
  torch::Tensor full = torch::empty({vocab_size_, dim_});
  torch::nn::init::normal_(full);  // as torch::nn::Embedding
  load_full(full);
}

void VocabParallelEmbeddingImpl::load_full(const torch::Tensor& full) {
  if (full.dim() != 2 || full.size(0) != vocab_size_ || full.size(1) != dim_)
    throw std::invalid_argument("VocabParallelEmbedding::load_full: expected [" + std::to_string(vocab_size_) + ", " +
                                std::to_string(dim_) + "], got " + c10::str(full.sizes()));
  torch::NoGradGuard no_grad;
  weight.copy_(full.narrow(0, first_, weight.size(0)));
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& tokens) {
  return reduce_from_group(partial(tokens), group_);
}

torch::Tensor VocabParallelEmbeddingImpl::partial(const torch::Tensor& tokens) {
  const int64_t rows = weight.size(0);
  const torch::Tensor mine = (tokens >= first_) & (tokens < first_ + rows);
  const torch::Tensor local = torch::where(mine, tokens - first_, torch::zeros_like(tokens));
  return torch::nn::functional::embedding(local, weight) * mine.unsqueeze(-1).to(weight.dtype());
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits_slice, const torch::Tensor& targets,
                                           const CommPtr& group) {
  if (logits_slice.dim() != 2 || targets.dim() != 1 || targets.size(0) != logits_slice.size(0))
    throw std::invalid_argument("vocab_parallel_cross_entropy: expected logits [N, V / ranks] and targets [N], got " +
                                c10::str(logits_slice.sizes()) + " and " + c10::str(targets.sizes()));
  const int64_t columns = logits_slice.size(1);
  const int64_t first = group->rank() * columns;
  // Shifting by the row maximum keeps exp() finite; the loss does not depend
  // on the shift, so it carries no gradient.
  torch::Tensor row_max = std::get<0>(logits_slice.detach().max(1));
  group->blocking().all_reduce(row_max, ReduceOp::Max);
  const torch::Tensor shifted = logits_slice - row_max.unsqueeze(1);
  const torch::Tensor sum_exp = reduce_from_group(shifted.exp().sum(1), group);
  const torch::Tensor mine = (targets >= first) & (targets < first + columns);
  const torch::Tensor local = torch::where(mine, targets - first, torch::zeros_like(targets));
  const torch::Tensor picked = shifted.gather(1, local.unsqueeze(1)).squeeze(1) * mine.to(shifted.dtype());
  return sum_exp.log() - reduce_from_group(picked, group);
}

}  // namespace dtrain::tp
