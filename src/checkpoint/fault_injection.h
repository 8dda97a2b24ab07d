// Faults on demand, for testing the checkpoint writers without root and
// without luck (issue 16). Both are off unless their variable is set.
//
// DTRAIN_FAULT_DISK_BYTES=N: a full disk. This process's checkpoint and
// safetensors writes fail with ENOSPC ("No space left on device") once N
// bytes have been written in total, as a full filesystem would.
//
// DTRAIN_FAULT_CRASH_AT=K (with DTRAIN_FAULT_CRASH_RANK=R, default 0): a
// crash. Rank R kills itself with SIGKILL at the K-th crash point it passes;
// the checkpoint writers mark one between every two filesystem operations of
// a save and of pruning, so a test can stop a save at each of them in turn.
//
// DTRAIN_TEST_SLOW_CHECKPOINT_WRITE=STEP:MS (testing only): a slow disk.
// Every rank, having written its file of the checkpoint of step STEP, says
// so on stderr ("rank R (pid P) holds the write of step STEP") and waits MS
// milliseconds before the ranks agree that all wrote (so before the
// manifest and the rename). With --checkpoint-async the wait is on the
// writer thread, which lets a test kill a rank in the middle of a
// background write (tests/train/check_checkpoint_async.py kills the pid it
// names).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace dtrain::detail {

// ::write(fd, data, size), or -1 with errno = ENOSPC when the simulated disk
// is full (a partial write first, as a real one would be).
ssize_t write_to_disk(int fd, const void* data, size_t size);

// A crash point (see above); `where` is named on stderr before the kill.
void crash_point(const char* where);

// The slow disk above: waits when `step` is the one named (rank `rank`
// says so on stderr first).
void slow_write_point(int64_t step, int rank);

}  // namespace dtrain::detail
