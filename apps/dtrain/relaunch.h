// Starting this same dtrain command as the ranks of a local job: what
// `dtrain train` and `dtrain bench collectives|ddp|checkpoint` do when run
// outside a launched job (`dtrain bench fsdp` too, once per job, adding
// --job and --job-json). The ranks get every word of the command line as it
// was given, so a flag added to a subcommand reaches its ranks without being
// forwarded by hand (and a flag left unset stays unset, defaults included).
#pragma once

#include <string>
#include <vector>

namespace dtrain::cli {

// Runs `dtrain WORDS...` as `nproc` ranks over `backend` (dtrain::cli::launch)
// and returns the job's exit code. `threads_per_rank` 0 = cores / ranks.
int relaunch_as_job(const std::vector<std::string>& words, int nproc, const std::string& backend,
                    int threads_per_rank = 0);

}  // namespace dtrain::cli
