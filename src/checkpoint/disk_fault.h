// A simulated full disk for testing checkpoint writers without root
// (issue 16): DTRAIN_FAULT_DISK_BYTES=N makes this process's checkpoint and
// safetensors writes fail with ENOSPC ("No space left on device") once N
// bytes have been written in total, as a full filesystem would. Unset: no
// effect.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace dtrain::detail {

// ::write(fd, data, size), or -1 with errno = ENOSPC when the simulated disk
// is full (a partial write first, as a real one would be).
ssize_t write_to_disk(int fd, const void* data, size_t size);

}  // namespace dtrain::detail
