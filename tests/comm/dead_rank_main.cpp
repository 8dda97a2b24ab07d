// A job with a rank that never joins the collective must end (non-zero), not
// hang. Run on two ranks under the launcher through tests/expect_failure.py:
//   exit:  rank 1 exits with code 3 right after init; rank 0 all_reduces and
//          waits (DTRAIN_TIMEOUT=5).
//   sleep: rank 1 stays alive but sleeps 30 s without issuing the collective;
//          rank 0's watchdog must end the job (DTRAIN_TIMEOUT=2).
//   sleep-nowait: as sleep, but rank 0 returns from main without waiting for
//          its all_reduce, so the stuck operation is met by the
//          communicator's destructor; the watchdog must still end the job.
// Every line starts with "dead_rank[MODE] rank R:" so the test can tell this
// program's progress from the launcher's messages.
#include <dtrain/comm.h>

#include "say.h"

#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <unistd.h>
#include <thread>

int main(int argc, char** argv) {
  auto world = dtrain::init(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "exit";
  const int rank = world->rank();
  const std::string me = "dead_rank[" + mode + "] rank " + std::to_string(rank) + ": ";
  if (mode != "exit" && mode != "sleep" && mode != "sleep-nowait") {
    say(me + "unknown mode (use exit, sleep or sleep-nowait)");
    return 2;
  }
  if (world->size() < 2) {
    say(me + "needs at least 2 ranks");
    return 2;
  }
  if (rank == 1) {
    if (mode == "exit") {
      say(me + "exiting with code 3 before the collective");
      std::_Exit(3);
    }
    say(me + "sleeping 30 s instead of joining the all_reduce");
    std::this_thread::sleep_for(std::chrono::seconds(30));
    say(me + "UNEXPECTED: still alive after 30 s");
    std::_Exit(4);
  }
  say(me + "waiting in all_reduce (timeout " + std::to_string(world->timeout().count()) + " ms)");
  auto tensor = torch::ones({10});
  if (mode == "sleep-nowait") {
    auto work = world->all_reduce(tensor);
    say(me + "returning 0 from main without waiting; the destructor meets the stuck all_reduce");
    return 0;
  }
  try {
    world->all_reduce(tensor)->wait();
  } catch (const dtrain::CommError& error) {
    say(me + "CommError: " + error.what());
    return 1;
  }
  say(me + "UNEXPECTED: all_reduce completed without rank 1");
  return 0;
}
