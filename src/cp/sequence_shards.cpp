// Causal load balancing for context parallelism (dtrain/context_parallel.h):
// which chunks of a sequence a cp rank holds, their positions, and the
// attention work that gives each rank.
#include "dtrain/context_parallel.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>

namespace dtrain::cp {
namespace {

// The chunk length: T / (2·size), refused when T does not split so.
int64_t chunk_of(int64_t T, int size, int rank) {
  if (size < 1 || rank < 0 || rank >= size)
    throw std::invalid_argument("context parallel: rank " + std::to_string(rank) + " of " + std::to_string(size));
  if (T % (2 * size) != 0)
    throw std::invalid_argument("context parallel: a sequence of " + std::to_string(T) +
                                " tokens does not split into the " + std::to_string(2 * size) +
                                " equal chunks cp = " + std::to_string(size) +
                                " needs (a head and a tail per rank): use a --seq-len divisible by " +
                                std::to_string(2 * size));
  return T / (2 * size);
}

}  // namespace

torch::Tensor shard_sequence(const torch::Tensor& x, int64_t dim, int size, int rank) {
  const int64_t c = chunk_of(x.size(dim), size, rank);
  if (size == 1) return x;
  return torch::cat({x.narrow(dim, rank * c, c), x.narrow(dim, (2 * size - 1 - rank) * c, c)}, dim);
}

torch::Tensor shard_positions(int64_t T, int size, int rank, const torch::Device& device) {
  const int64_t c = chunk_of(T, size, rank);
  const auto options = torch::TensorOptions().dtype(torch::kLong).device(device);
  if (size == 1) return torch::arange(T, options);
  const int64_t head = rank * c, tail = (2 * size - 1 - rank) * c;
  return torch::cat({torch::arange(head, head + c, options), torch::arange(tail, tail + c, options)});
}

int64_t causal_pairs(int64_t T, int size, int rank, bool balanced) {
  // Queries at positions [first, first + n) see first + 1 ... first + n keys.
  const auto pairs = [](int64_t first, int64_t n) { return n * first + n * (n + 1) / 2; };
  if (!balanced) {
    if (T % size != 0)
      throw std::invalid_argument("causal_pairs: " + std::to_string(T) + " tokens over " + std::to_string(size));
    const int64_t slice = T / size;
    return pairs(rank * slice, slice);
  }
  const int64_t c = chunk_of(T, size, rank);
  return pairs(rank * c, c) + pairs((2 * size - 1 - rank) * c, c);
}

}  // namespace dtrain::cp
