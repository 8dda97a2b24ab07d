// Elastic world size (dtrain launch -n MIN:MAX / dtrain train --nproc
// MIN:MAX, with --hosts and --max-restarts): each attempt of a job runs on
// the hosts that answer when it starts, so a job that lost a host for good
// restarts on the ranks that remain, and grows back when the host returns.
//
// The unit that comes and goes is a host with its slots (HOST:SLOTS): ranks
// on one machine do not disappear one by one. Before every attempt the
// launcher probes each host with the same mpirun that will start the job
// (`mpirun --host HOST:1 -np 1 true`, all hosts at once, each within
// DTRAIN_HOST_PROBE_TIMEOUT seconds, default 15), which checks the whole path
// a rank needs: the launch agent (ssh), the daemon and its connection back.
// The attempt then runs min(MAX, slots of the hosts that answered) ranks; with
// fewer than MIN it does not start, and the job ends saying which hosts were
// lost.
//
// What a resize keeps (docs/elastic.md): the global batch (--batch-size is
// samples per step over all ranks, split anew among the ranks there are), so
// a step, the learning-rate schedule (in steps), and the sample order stay
// the same; every rank's part comes from the same world-size-independent
// sample stream, and the checkpoint is resharded to the new world size.
#pragma once

#include <chrono>
#include <future>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::cli {

// -n / --nproc: N (min = max = N) or MIN:MAX.
struct RankRange {
  int min = 0;
  int max = 0;
  bool elastic() const { return min < max; }
};

// Parses "N" or "MIN:MAX" (1 <= MIN <= MAX). Throws std::invalid_argument
// naming `flag` and the expected form.
RankRange parse_rank_range(const std::string& text, const std::string& flag);

// "4" or "2:4", as the user would write it.
std::string to_string(const RankRange& range);

struct HostSlots {
  std::string host;
  int slots = 0;  // 0: not given (HOST alone)
};

// Parses "HOST[:SLOTS],..." (SLOTS >= 1). Throws std::invalid_argument.
std::vector<HostSlots> parse_hosts(const std::string& hosts);

// "hA:2,hB:2"
std::string to_string(const std::vector<HostSlots>& hosts);

// Where one attempt runs.
struct Placement {
  int nproc = 0;
  std::string hosts;               // for mpirun --host; "" = this machine
  std::vector<HostSlots> lost;     // hosts that did not answer the probe
  std::vector<std::string> why;    // for each lost host, what the probe saw
};

// The hosts that answer now (probing all of them at once, see above) and the
// ranks to run on them; every host must have its slots. Throws std::runtime_error, naming the lost hosts and
// what their probes said, when their slots add up to fewer than range.min.
Placement place_elastic_job(const std::vector<HostSlots>& hosts, const RankRange& range);

// Probes every host at once (see above); why[i] is "" for a host that
// answered, else what its probe saw. A probe that does not answer is killed
// with everything it started (its ssh too).
std::vector<std::string> probe_hosts(const std::vector<HostSlots>& hosts);

// Throws std::invalid_argument for a DTRAIN_HOST_PROBE_TIMEOUT or
// DTRAIN_HOST_PROBE_INTERVAL that is not a number of seconds > 0.
void check_probe_settings();

// Growing back while an attempt runs short of MAX ranks: every
// DTRAIN_HOST_PROBE_INTERVAL seconds (default 60) the lost hosts are probed
// in the background; once one answers, poll() says so (once), and the
// launcher stops the job with SIGUSR1, on which dtrain train saves a
// checkpoint at the end of its step and exits, and restarts it on the larger
// world (apps/dtrain/restarts.cpp: only if that checkpoint is of the last
// step done; else the stop counts as a failure).
class GrowWatch {
 public:
  GrowWatch(const Placement& placement, const RankRange& range);
  ~GrowWatch();
  GrowWatch(const GrowWatch&) = delete;
  GrowWatch& operator=(const GrowWatch&) = delete;

  // Cheap; called from the launcher's supervision loop. A message for the
  // log when the job should stop to grow; nullopt otherwise.
  std::optional<std::string> poll();

 private:
  std::vector<HostSlots> lost_;
  int running_;
  RankRange range_;
  std::chrono::steady_clock::duration interval_;
  std::chrono::steady_clock::time_point next_probe_;
  std::future<std::vector<std::string>> probe_;
};

// One line for the log: "4 ranks on hA:2,hB:2" or "2 ranks on hA:2 (hB:2 lost: ...)".
std::string describe(const Placement& placement);

}  // namespace dtrain::cli
