#include "checkpoint/disk_fault.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

namespace dtrain::detail {
namespace {

// Bytes left on the simulated disk; negative: no simulation.
std::atomic<int64_t>& bytes_left() {
  static std::atomic<int64_t> left = [] {
    const char* value = std::getenv("DTRAIN_FAULT_DISK_BYTES");
    if (value == nullptr || *value == '\0') return int64_t{-1};
    char* end = nullptr;
    const long long bytes = std::strtoll(value, &end, 10);
    return (*end == '\0' && bytes >= 0) ? static_cast<int64_t>(bytes) : int64_t{-1};
  }();
  return left;
}

}  // namespace

ssize_t write_to_disk(int fd, const void* data, size_t size) {
  auto& left = bytes_left();
  int64_t now = left.load();
  if (now < 0) return ::write(fd, data, size);
  if (now == 0 && size > 0) {
    errno = ENOSPC;
    return -1;
  }
  const size_t allowed = static_cast<size_t>(now) < size ? static_cast<size_t>(now) : size;
  const ssize_t written = ::write(fd, data, allowed);
  if (written > 0) left.fetch_sub(written);
  return written;
}

}  // namespace dtrain::detail
