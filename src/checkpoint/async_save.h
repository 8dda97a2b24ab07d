// Checkpoints written in the background (dtrain train --checkpoint-async):
// save() copies this rank's pieces into host memory (Note [staging buffer])
// and returns; a writer thread then runs the same protocol a blocking save
// runs (save_protocol.h: temporary directory, fsync, agreement, manifest
// last, one atomic rename), so a checkpoint is complete or invisible exactly
// as before. One save at a time: the next save(), and wait(), wait for it.
//
// Note [the writer's own communicator]: the writer thread's agreements
// (rank 0 made the directory; every rank wrote its file; the file records
// for the manifest; the rename worked) are collectives, and the training
// thread issues its own collectives at the same time. Two threads issuing on
// one Communicator would interleave differently on different ranks (rank 0's
// agreement could meet rank 1's all-gather of gradients): a mismatch or a
// deadlock. So the writer thread has a communicator of its own, made by
// world->split(0, rank) when the writer is built, used by nothing else: each
// communicator runs its operations in issue order on its own thread
// (MPI_THREAD_MULTIPLE; docs/communicator.md), and on each the ranks issue
// the same sequence. The other way, agreeing on the training thread at the
// next checkpoint or at the end, would publish a checkpoint only one
// interval later: a crash in between would lose the interval the background
// write had already put on disk. The cost is one more communicator (and its
// thread) per rank.
#pragma once

#include "checkpoint/held_state.h"
#include "checkpoint/staging_buffer.h"

#include <dtrain/comm.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <thread>

namespace dtrain::detail {

class BackgroundCheckpointWriter {
 public:
  // Collective over `world` (null or one rank: no communicator is needed).
  explicit BackgroundCheckpointWriter(const CommPtr& world);
  // Waits for a save in flight; its error, if any, is dropped (call wait()
  // to learn it).
  ~BackgroundCheckpointWriter();
  BackgroundCheckpointWriter(const BackgroundCheckpointWriter&) = delete;
  BackgroundCheckpointWriter& operator=(const BackgroundCheckpointWriter&) = delete;

  // Every rank calls it in the same order. Waits for the previous save
  // (throwing its error), copies `held` and the optimizer's state for it into
  // the staging buffer, and starts writing them to `dir` as the checkpoint
  // of `step`; `published` runs on the writer thread once the checkpoint is
  // in place (every rank's writer passes the same point together).
  void save(const std::string& dir, const HeldModel& held, torch::optim::Optimizer* optimizer, int64_t step,
            const std::map<std::string, std::string>& extra, std::function<void()> published);
  // Waits for the save in flight, if any; throws what it threw (on every
  // rank alike: the writers agree on failures).
  void wait();
  // The step of the save wait() would wait for; 0 when none.
  int64_t in_flight() const { return in_flight_; }
  int64_t staging_bytes() const { return staging_.bytes(); }

 private:
  CommPtr comm_;
  StagingBuffer staging_;
  RankFile file_;  // views of the staging buffer, while the writer writes them
  std::thread writer_;
  std::exception_ptr error_;
  int64_t in_flight_ = 0;
};

}  // namespace dtrain::detail
