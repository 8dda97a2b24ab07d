// Starting this same dtrain command as the ranks of a local job: what
// `dtrain train` and `dtrain bench collectives|ddp|checkpoint` do when run
// outside a launched job (`dtrain bench fsdp` too, once per job, adding
// --job and --job-json). The ranks get every word of the command line as it
// was given, so a flag added to a subcommand reaches its ranks without being
// forwarded by hand (and a flag left unset stays unset, defaults included).
// With --hosts (add_hosts_option) the job spans hosts, as `dtrain launch
// --hosts` does (mpirun); without it, it is local as before.
#pragma once

#include "restarts.h"

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace dtrain::cli {

// Runs `dtrain WORDS...` as `nproc` ranks over `backend` (dtrain::cli::launch)
// and returns the job's exit code. `threads_per_rank` 0 = cores / ranks.
// `hosts` "HOST:SLOTS,..." places the ranks across hosts (mpi only, like
// `dtrain launch --hosts`); empty = this machine.
// `restarts` (max_restarts > 0): restart the job on failure (apps/dtrain/restarts.h).
int relaunch_as_job(const std::vector<std::string>& words, int nproc, const std::string& backend,
                    int threads_per_rank = 0, const std::string& hosts = "", const RestartOptions& restarts = {});

// Declares --hosts on a benchmark that relaunches itself, with the same
// meaning as `dtrain launch --hosts` (bench/network.sh uses it).
void add_hosts_option(CLI::App& command, std::string& hosts);

}  // namespace dtrain::cli
