#include "relaunch.h"

#include "launch.h"

#include <CLI/CLI.hpp>

namespace dtrain::cli {

int relaunch_as_job(const std::vector<std::string>& words, int nproc, const std::string& backend,
                    int threads_per_rank, const std::string& hosts, const RestartOptions& restarts) {
  LaunchOptions job;
  job.nproc = nproc;
  job.min_nproc = restarts.min_ranks;
  job.backend = backend;
  job.hosts = hosts;
  job.threads_per_rank = threads_per_rank;
  job.max_restarts = restarts.max_restarts;
  job.checkpoint_dir = restarts.checkpoint_dir;
  job.command = {self_executable()};
  job.command.insert(job.command.end(), words.begin(), words.end());
  return launch(job);
}

void add_hosts_option(CLI::App& command, std::string& hosts) {
  command.add_option("--hosts", hosts,
                     "HOST:SLOTS,... to run the ranks across hosts (mpi backend; as dtrain launch --hosts). "
                     "Default: this machine");
}

}  // namespace dtrain::cli
