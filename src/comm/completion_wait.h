// How the communication thread waits for an MPI operation to complete.
//
// Note [waiting without spinning]
// A blocking MPI collective polls its progress engine in a tight loop until
// the peers have done their part. On the communicator's background thread
// that loop competes with the rank's own compute threads for the same cores
// (ranks x threads = cores), so an all-reduce overlapped with backward, or a
// prefetched all-gather, took CPU time from the compute it was meant to hide
// behind (docs/communicator.md, "Waiting"). So operations that may overlap
// compute are issued non-blocking (MPI_I*) and completed by a test loop whose
// pace depends on who is waiting:
//   - the first `spin_for` it tests without pause, so a short operation keeps
//     its latency;
//   - while a thread is blocked in Work::wait() on this communicator (the
//     result is on the critical path, and that thread is not computing), it
//     keeps testing without pause, as a blocking call would;
//   - otherwise it yields the core between tests until `yield_for`, then
//     sleeps between tests, 10 us doubling up to `max_sleep`: progress
//     continues at every test (OpenMPI progresses non-blocking collectives
//     only inside MPI calls), at a pace that leaves the cores to compute.
// Which mode. OpenMPI's non-blocking collectives (coll/libnbc) are slower
// than its blocking ones (coll/tuned) on shared memory: MPI_Iallreduce takes
// about twice as long as MPI_Allreduce from 64 KiB to 64 MiB between two
// local ranks (docs/communicator.md, "Waiting"). There the copying is CPU
// work the rank has to do anyway; the waste is spinning while the peers have
// not yet arrived. So on one host the default is Handshake: the ranks first
// meet in a non-blocking barrier, waited for by the test loop, and then run
// the blocking, tuned collective, which spins only while the data moves.
// Across hosts most of an operation's time is waiting on the wire, so there
// the operation itself is non-blocking (Backoff).
// Small operations (below `nonblocking_min_bytes`) stay blocking calls: they
// finish in microseconds, and OpenMPI's blocking algorithms (coll/tuned) are
// faster than its non-blocking ones (coll/libnbc) at those sizes. The rule
// depends only on the operation's size, which every rank shares, so all ranks
// choose the same form (MPI forbids matching a blocking collective with a
// non-blocking one).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace dtrain {

struct WaitSettings {
  enum class Mode {
    Spin,       // every operation a blocking MPI call (dtrain before issue 18)
    Backoff,    // operations non-blocking, completed by the test loop above
    Handshake,  // an MPI_Ibarrier completed by the test loop, then the blocking call
  };
  // Handshake when every rank is on this host (shared memory), else Backoff:
  // see Note [waiting without spinning], "Which mode".
  Mode mode = Mode::Backoff;
  std::chrono::microseconds spin_for{50};
  std::chrono::microseconds yield_for{200};
  std::chrono::microseconds max_sleep{200};
  int64_t nonblocking_min_bytes = 64 << 10;

  // `all_local`: every rank of the job runs on this host.
  // DTRAIN_COMM_WAIT=spin|backoff|handshake, DTRAIN_COMM_MAX_SLEEP_US,
  // DTRAIN_COMM_NONBLOCKING_MIN_BYTES (docs/communicator.md); a bad value is
  // a CommError naming the variable.
  static WaitSettings from_environment(bool all_local);
};

// One operation's test loop: call pause() after every test that found the
// operation unfinished.
class CompletionWait {
 public:
  // `waiters`: how many threads are blocked in Work::wait() on this
  // communicator (CommThread::waiters()); may be null (then never urgent).
  CompletionWait(const WaitSettings& settings, const std::atomic<int>* waiters);
  void pause();

 private:
  const WaitSettings& settings_;
  const std::atomic<int>* waiters_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::microseconds sleep_{10};
};

}  // namespace dtrain
