#include "checkpoint/rank_agreement.h"

#include <torch/types.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace dtrain::detail {

std::vector<int64_t> all_max(const CommPtr& comm, std::vector<int64_t> flags) {
  if (!comm || comm->size() == 1 || flags.empty()) return flags;
  auto tensor = torch::tensor(flags, torch::kInt64);
  comm->blocking().all_reduce(tensor, ReduceOp::Max);
  return std::vector<int64_t>(tensor.data_ptr<int64_t>(), tensor.data_ptr<int64_t>() + tensor.numel());
}

void agree_or_throw(const CommPtr& comm, const std::string& error) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  // world - (the lowest failing rank); 0: none failed.
  const int64_t failed = all_max(comm, {error.empty() ? 0 : static_cast<int64_t>(world - rank)})[0];
  if (!error.empty()) throw std::runtime_error(error);
  if (failed != 0) {
    const int64_t first = world - failed;
    throw std::runtime_error("checkpoint: rank " + std::to_string(first) + " failed (its error says why)");
  }
}

std::vector<std::string> all_gather_strings(const CommPtr& comm, const std::string& text) {
  if (!comm || comm->size() == 1) return {text};
  const int world = comm->size();
  auto lengths = torch::zeros({world}, torch::kInt64);
  lengths[comm->rank()] = static_cast<int64_t>(text.size());
  comm->blocking().all_reduce(lengths, ReduceOp::Sum);
  const int64_t longest = std::max<int64_t>(1, lengths.max().item<int64_t>());
  auto mine = torch::zeros({longest}, torch::kUInt8);
  std::memcpy(mine.data_ptr<uint8_t>(), text.data(), text.size());
  auto all = torch::empty({longest * world}, torch::kUInt8);
  comm->blocking().all_gather(mine, all);
  std::vector<std::string> result;
  for (int r = 0; r < world; ++r) {
    const auto* bytes = reinterpret_cast<const char*>(all.data_ptr<uint8_t>() + r * longest);
    result.emplace_back(bytes, static_cast<size_t>(lengths[r].item<int64_t>()));
  }
  return result;
}

}  // namespace dtrain::detail
