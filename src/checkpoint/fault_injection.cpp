#include "checkpoint/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

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

int64_t integer_from_environment(const char* name, int64_t otherwise) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return otherwise;
  char* end = nullptr;
  const long long number = std::strtoll(value, &end, 10);
  return *end == '\0' ? static_cast<int64_t>(number) : otherwise;
}

int64_t this_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK"}) {
    if (std::getenv(name)) return integer_from_environment(name, 0);
  }
  return 0;
}

}  // namespace

void crash_point(const char* where) {
  static const int64_t crash_at = integer_from_environment("DTRAIN_FAULT_CRASH_AT", 0);
  static const bool this_one = crash_at > 0 && this_rank() == integer_from_environment("DTRAIN_FAULT_CRASH_RANK", 0);
  static std::atomic<int64_t> passed{0};
  if (!this_one || ++passed != crash_at) return;
  std::fprintf(stderr, "dtrain: DTRAIN_FAULT_CRASH_AT=%lld: rank %lld kills itself %s\n",
               static_cast<long long>(crash_at), static_cast<long long>(this_rank()), where);
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
}

void slow_write_point(int64_t step, int rank) {
  static const std::string setting = [] {
    const char* value = std::getenv("DTRAIN_TEST_SLOW_CHECKPOINT_WRITE");
    return std::string(value ? value : "");
  }();
  const auto colon = setting.find(':');
  if (colon == std::string::npos) return;
  char* end = nullptr;
  const long long slow_step = std::strtoll(setting.c_str(), &end, 10);
  const long long ms = std::strtoll(setting.c_str() + colon + 1, &end, 10);
  if (slow_step != step || ms <= 0) return;
  std::fprintf(stderr,
               "dtrain: DTRAIN_TEST_SLOW_CHECKPOINT_WRITE=%s: rank %d (pid %d) holds the write of step %lld for %lld ms\n",
               setting.c_str(), rank, static_cast<int>(::getpid()), slow_step, ms);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

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
