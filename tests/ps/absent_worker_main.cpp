// A parameter-server job in which one worker never pushes must end with an
// error that names that worker, not hang. Three ranks (workers 0 and 1,
// server = rank 2), DTRAIN_TIMEOUT=2: worker 1 sleeps 30 s without pushing;
// worker 0 pushes once and finishes. The server's wait for any message, and
// worker 0's wait for the final parameters, both end in a CommError.
#include <dtrain/ps.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

int main(int argc, char** argv) {
  auto world = dtrain::init(argc, argv);
  namespace ps = dtrain::ps;
  const ps::Group group(world, {.mode = ps::Mode::Async, .servers = 1});
  auto weights = torch::zeros({4}).set_requires_grad(true);
  try {
    if (group.is_server()) {
      ps::serve(group, {weights}, [](std::vector<torch::Tensor> p) {
        return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1));
      });
    } else {
      ps::Worker worker(group, {weights});
      if (group.worker_index() == 1) {
        std::cout << "absent_worker: worker 1 sleeping without pushing" << std::endl;
        std::this_thread::sleep_for(std::chrono::seconds(30));
      }
      weights.mutable_grad() = torch::ones({4});
      worker.push_and_pull(0.1);
      worker.finish();
    }
  } catch (const std::exception& error) {
    // Leave at once: unwinding would destroy communicators with a receive
    // still posted, and the job should end with this message, not the
    // watchdog's.
    std::cerr << "absent_worker: rank " << world->rank() << ": " << error.what() << std::endl;
    std::fflush(nullptr);
    std::_Exit(1);
  }
  return 0;
}
