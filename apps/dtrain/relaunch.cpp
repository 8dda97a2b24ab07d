#include "relaunch.h"

#include "launch.h"

namespace dtrain::cli {

int relaunch_as_job(const std::vector<std::string>& words, int nproc, const std::string& backend,
                    int threads_per_rank) {
  LaunchOptions job;
  job.nproc = nproc;
  job.backend = backend;
  job.threads_per_rank = threads_per_rank;
  job.command = {self_executable()};
  job.command.insert(job.command.end(), words.begin(), words.end());
  return launch(job);
}

}  // namespace dtrain::cli
