#include "comm/replicas.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <climits>
#include <map>
#include <sstream>
#include <stdexcept>

namespace dtrain::detail {
namespace {

std::string describe(const NamedTensor& t) {
  std::ostringstream out;
  out << t.kind << " '" << t.name << "' " << dtype_name(t.tensor.scalar_type()) << " " << t.tensor.sizes();
  return out.str();
}

torch::Tensor bytes_of(const std::string& text) {
  auto bytes = torch::empty({static_cast<int64_t>(text.size())}, torch::kUInt8);
  std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
  return bytes;
}

// Rank `root`'s string on every rank (two broadcasts: length, then bytes).
std::string broadcast_string(Communicator& comm, const std::string& mine, int root) {
  auto length = torch::tensor({static_cast<int64_t>(mine.size())}, torch::kInt64);
  comm.blocking().broadcast(length, root);
  auto bytes = comm.rank() == root ? bytes_of(mine) : torch::empty({length.item<int64_t>()}, torch::kUInt8);
  comm.blocking().broadcast(bytes, root);
  const auto* data = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>());
  return std::string(data, data + bytes.numel());
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// "" when equal, else this rank's first difference from rank 0, in words.
std::string first_difference(const std::vector<std::string>& reference, const std::vector<std::string>& mine,
                             int rank) {
  const size_t common = std::min(reference.size(), mine.size());
  for (size_t i = 0; i < common; ++i) {
    if (reference[i] != mine[i]) {
      return "rank " + std::to_string(rank) + " has " + mine[i] + " where rank 0 has " + reference[i];
    }
  }
  if (mine.size() > reference.size()) {
    return "rank " + std::to_string(rank) + " has " + std::to_string(mine.size()) + " tensors and rank 0 has " +
           std::to_string(reference.size()) + "; the first extra one is " + mine[common];
  }
  if (mine.size() < reference.size()) {
    return "rank " + std::to_string(rank) + " has " + std::to_string(mine.size()) + " tensors and rank 0 has " +
           std::to_string(reference.size()) + "; the first missing one is " + reference[common];
  }
  return "";
}

}  // namespace

void check_same_on_all_ranks(Communicator& comm, const std::vector<NamedTensor>& tensors, const std::string& who) {
  if (comm.size() == 1) return;
  std::string mine;
  for (const auto& t : tensors) mine += describe(t) + "\n";
  const std::string reference = broadcast_string(comm, mine, 0);
  const std::string difference = first_difference(split_lines(reference), split_lines(mine), comm.rank());

  auto first_differing_rank = torch::tensor({difference.empty() ? INT_MAX : comm.rank()}, torch::kInt32);
  comm.blocking().all_reduce(first_differing_rank, ReduceOp::Min);
  const int culprit = first_differing_rank.item<int>();
  if (culprit == INT_MAX) return;
  const std::string message = broadcast_string(comm, difference, culprit);
  throw std::runtime_error(who + ": the model differs across ranks: " + message +
                           ". Every rank must build the same model (same modules, shapes and dtypes) before "
                           "wrapping it.");
}

void broadcast_from_rank0(Communicator& comm, const std::vector<torch::Tensor>& tensors) {
  if (comm.size() == 1 || tensors.empty()) return;
  torch::NoGradGuard no_grad;
  // Ordered map: the same groups in the same order, hence the same
  // collectives, on every rank.
  std::map<std::string, std::vector<torch::Tensor>> by_kind;
  for (const auto& t : tensors) by_kind[dtype_name(t.scalar_type()) + "@" + t.device().str()].push_back(t);
  for (auto& [kind, group] : by_kind) {
    std::vector<torch::Tensor> flat;
    for (const auto& t : group) flat.push_back(t.detach().reshape({-1}));
    auto packed = torch::cat(flat);
    comm.blocking().broadcast(packed, 0);
    int64_t offset = 0;
    for (auto& t : group) {
      const int64_t n = t.numel();
      t.detach().copy_(packed.narrow(0, offset, n).view(t.sizes()));
      offset += n;
    }
  }
}

}  // namespace dtrain::detail
