#include "train/sample_log.h"

#include "train/restarts.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace dtrain::train {
namespace {

// DTRAIN_TEST_SAMPLE_LOG, opened once; -1 when unset.
int sample_log_fd() {
  static const int fd = [] {
    const char* path = std::getenv("DTRAIN_TEST_SAMPLE_LOG");
    if (path == nullptr || *path == '\0') return -1;
    const int opened = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (opened < 0)
      std::fprintf(stderr, "dtrain: DTRAIN_TEST_SAMPLE_LOG: cannot open %s: %s\n", path, std::strerror(errno));
    return opened;
  }();
  return fd;
}

void append_number(std::string& line, long long value) {
  char digits[24];
  const int length = std::snprintf(digits, sizeof(digits), "%lld", value);
  line.append(digits, static_cast<size_t>(length));
}

}  // namespace

void log_samples(int world, int rank, int64_t step, int64_t dataset_size, int64_t global_batch,
                 const std::vector<int64_t>& indices) {
  const int fd = sample_log_fd();
  if (fd < 0) return;
  static const int64_t attempt = restart_count_from_environment();
  std::string line;
  line.reserve(128 + indices.size() * 8);
  const std::pair<const char*, long long> fields[] = {
      {"{\"attempt\":", attempt}, {",\"world\":", world},          {",\"rank\":", rank},
      {",\"step\":", step},       {",\"dataset_size\":", dataset_size}, {",\"global_batch\":", global_batch}};
  for (const auto& [key, value] : fields) {
    line += key;
    append_number(line, value);
  }
  line += ",\"indices\":[";
  for (size_t i = 0; i < indices.size(); ++i) {
    if (i > 0) line += ',';
    append_number(line, indices[i]);
  }
  line += "]}\n";
  // One write(): with O_APPEND the whole line lands at the end, after or
  // before another rank's, never inside it.
  const ssize_t written = ::write(fd, line.data(), line.size());
  if (written != static_cast<ssize_t>(line.size()))
    std::fprintf(stderr, "dtrain: DTRAIN_TEST_SAMPLE_LOG: short write of step %lld (%zd of %zu bytes)\n",
                 static_cast<long long>(step), written, line.size());
}

}  // namespace dtrain::train
