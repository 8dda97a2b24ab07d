// Debug mode (DTRAIN_DEBUG=1) turns mismatched collectives into an error that
// names both sides. Run on exactly two ranks:
//   DTRAIN_DEBUG=1 dtrain launch -n 2 --backend mpi|c10d -- test_comm_mismatch [count|kind]
//   count: rank 0 all_reduces 10 floats, rank 1 12 floats;
//   kind:  rank 0 all_reduces 10 floats, rank 1 broadcasts 10 floats from rank 0.
// Each rank exits 0 only if its wait() threw a CommError whose message names
// both ranks' operations and the communicator then refuses further work; the
// launcher exits 0 only if every rank did.
#include <dtrain/comm.h>

#include "say.h"

#include <torch/torch.h>

#include <iostream>
#include <regex>
#include <string>
#include <unistd.h>
#include <vector>

int main(int argc, char** argv) {
  auto world = dtrain::init(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "count";
  const int rank = world->rank();
  const std::string me = "mismatch[" + mode + "] rank " + std::to_string(rank) + ": ";
  if (world->size() != 2) {
    say(me + "needs exactly 2 ranks, got " + std::to_string(world->size()));
    return 2;
  }
  if (mode != "count" && mode != "kind") {
    say(me + "unknown mode (use count or kind)");
    return 2;
  }

  std::vector<std::string> expected;
  std::string message;
  bool threw = false;
  try {
    if (mode == "count") {
      auto t = torch::ones({rank == 0 ? 10 : 12});
      world->all_reduce(t)->wait();
    } else {
      auto t = torch::ones({10});
      (rank == 0 ? world->all_reduce(t) : world->broadcast(t, 0))->wait();
    }
  } catch (const dtrain::CommError& error) {
    threw = true;
    message = error.what();
  }
  if (mode == "count")
    expected = {R"(rank 0 issued all_reduce #\d+ \(count=10\b)", R"(rank 1 issued all_reduce #\d+ \(count=12\b)"};
  else
    expected = {R"(rank 0 issued all_reduce #\d+ \(count=10\b)", R"(rank 1 issued broadcast #\d+ \(count=10\b.*root=0)"};

  bool ok = true;
  if (!threw) {
    say(me + "FAIL: wait() returned normally; expected a CommError naming both ranks' collectives");
    return 1;
  }
  say(me + "got CommError: " + message);
  for (const auto& pattern : expected) {
    if (!std::regex_search(message, std::regex(pattern))) {
      say(me + "FAIL: the message does not match /" + pattern + "/");
      ok = false;
    }
  }

  // After a failed collective the ranks are out of step: the communicator must
  // fail later operations at once instead of running them.
  try {
    world->barrier()->wait();
    say(me + "FAIL: a barrier after the mismatch succeeded");
    ok = false;
  } catch (const dtrain::CommError& error) {
    const std::string text = error.what();
    if (text.find("earlier failure") == std::string::npos) {
      say(me + "FAIL: the barrier after the mismatch failed with an unexpected message: " + text);
      ok = false;
    }
  }
  say(me + (ok ? "PASS" : "FAIL"));
  return ok ? 0 : 1;
}
