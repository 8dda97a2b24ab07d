#include "train/restarts.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <tuple>

namespace dtrain::train {
namespace {

int64_t integer_from_environment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return 0;
  char* end = nullptr;
  const long long number = std::strtoll(value, &end, 10);
  return *end == '\0' && number > 0 ? static_cast<int64_t>(number) : 0;
}

// The rank as the launcher set it: the step loop does not see the communicator.
int64_t this_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "RANK"})
    if (std::getenv(name)) return integer_from_environment(name);
  return 0;
}

// The progress file, opened once; -1 when there is none. A fixed-width record
// rewritten in place, so a reader never sees a half-written number grow.
int progress_fd() {
  static const int fd = [] {
    const char* path = std::getenv("DTRAIN_PROGRESS_FILE");
    if (path == nullptr || *path == '\0' || this_rank() != 0) return -1;
    return ::open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  }();
  return fd;
}

// Whether `spec` (DTRAIN_TEST_KILL_AT_STEP's form) names this rank, step
// `done` and attempt.
bool named_in(const char* spec, int64_t done) {
  if (spec == nullptr || *spec == '\0') return false;
  static const int64_t rank = this_rank();
  static const int64_t attempt = restart_count_from_environment();
  std::stringstream entries(spec);
  for (std::string entry; std::getline(entries, entry, ',');) {
    long long step = -1, who = -1, when = -1;
    const int fields = std::sscanf(entry.c_str(), "%lld:%lld:%lld", &step, &who, &when);
    if (fields >= 2 && step == done && who == rank && (fields == 2 || when == attempt)) return true;
  }
  return false;
}

}  // namespace

int64_t restart_count_from_environment() {
  if (std::getenv("DTRAIN_RESTART_COUNT")) return integer_from_environment("DTRAIN_RESTART_COUNT");
  return integer_from_environment("TORCHELASTIC_RESTART_COUNT");
}

RestartState restart_state_from_environment() {
  return {.restarts = restart_count_from_environment(),
          .steps_lost = integer_from_environment("DTRAIN_STEPS_LOST")};
}

void after_step(int64_t done) {
  if (const int fd = progress_fd(); fd >= 0) {
    char record[24];
    const int length = std::snprintf(record, sizeof(record), "%20lld\n", static_cast<long long>(done));
    if (::pwrite(fd, record, static_cast<size_t>(length), 0) != length) {
      // Progress is advice for the launcher's message; training goes on.
    }
  }
  static const char* kill_spec = std::getenv("DTRAIN_TEST_KILL_AT_STEP");
  static const char* hang_spec = std::getenv("DTRAIN_TEST_HANG_AT_STEP");
  for (const auto& [spec, name, signal] : {std::tuple{kill_spec, "KILL", SIGKILL}, std::tuple{hang_spec, "HANG", SIGSTOP}}) {
    if (!named_in(spec, done)) continue;
    std::fprintf(stderr, "dtrain: DTRAIN_TEST_%s_AT_STEP: rank %lld %s itself after step %lld\n", name,
                 static_cast<long long>(this_rank()), signal == SIGKILL ? "kills" : "stops", static_cast<long long>(done));
    std::fflush(stderr);
    ::kill(::getpid(), signal);
  }
}

}  // namespace dtrain::train
