#include "comm/c10d/process_groups.h"

#include "comm/env.h"
#include "dtrain/comm.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <string>

namespace dtrain {
namespace {

// Which network device Gloo binds to: GLOO_SOCKET_IFNAME as in PyTorch; the
// loopback address for single-machine jobs (hostname resolution is often
// broken in containers); else the address this machine's hostname resolves to.
std::shared_ptr<::gloo::transport::Device> choose_device() {
  if (const auto interface = env_string("GLOO_SOCKET_IFNAME"))
    return c10d::ProcessGroupGloo::createDeviceForInterface(*interface);
  const std::string master_addr = env_string("MASTER_ADDR").value_or("127.0.0.1");
  if (master_addr == "localhost" || master_addr.rfind("127.", 0) == 0)
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                  std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(choose_device());
  // One Gloo worker thread: dtrain already serialises a communicator's
  // operations on its own thread, and ranks share few cores.
  options->threads = 1;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

}  // namespace dtrain
