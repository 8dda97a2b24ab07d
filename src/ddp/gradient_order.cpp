#include "ddp/gradient_order.h"

#include "ddp/bucket_assignment.h"

#include <torch/types.h>

namespace dtrain::detail {

std::vector<int> agreed_gradient_order(Communicator& comm, const std::vector<int>& arrived, size_t parameters,
                                       int64_t& bytes_sent) {
  std::vector<int> order;
  std::vector<char> seen(parameters, 0);
  for (int p : arrived) {
    if (!seen[p]) order.push_back(p);
    seen[p] = 1;
  }
  for (int p : reverse_registration_order(parameters)) {
    if (!seen[p]) order.push_back(p);
  }
  // One rank, or one parameter: there is no other order to agree on.
  if (comm.size() == 1 || parameters < 2) return order;
  auto shared = torch::tensor(std::vector<int32_t>(order.begin(), order.end()), torch::kInt32);
  comm.blocking().broadcast(shared, 0);
  bytes_sent += shared.numel() * static_cast<int64_t>(sizeof(int32_t));
  const int32_t* values = shared.data_ptr<int32_t>();
  return std::vector<int>(values, values + shared.numel());
}

}  // namespace dtrain::detail
