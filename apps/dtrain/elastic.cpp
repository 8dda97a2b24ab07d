#include "elastic.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <future>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace dtrain::cli {
namespace {

// A whole positive number, or nothing.
bool parse_count(const std::string& text, int& count) {
  if (text.empty() || text.size() > 9 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }))
    return false;
  count = std::stoi(text);
  return count >= 1;
}

// Seconds from the environment variable `name`, else `fallback`.
double seconds_from_environment(const char* name, double fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (*end != '\0' || !std::isfinite(seconds) || seconds <= 0)
    throw std::invalid_argument(std::string(name) + " must be a number of seconds > 0, got '" + text + "'");
  return seconds;
}

double probe_timeout_seconds() { return seconds_from_environment("DTRAIN_HOST_PROBE_TIMEOUT", 15.0); }
double probe_interval_seconds() { return seconds_from_environment("DTRAIN_HOST_PROBE_INTERVAL", 60.0); }

// Every descendant of `root` (from /proc), deepest last.
std::vector<pid_t> descendants(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> parent_of;  // (pid, ppid)
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const auto close = line.rfind(')');  // the command may contain spaces and parentheses
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    char state = 0;
    long ppid = 0;
    if (rest >> state >> ppid) parent_of.emplace_back(static_cast<pid_t>(std::stol(name)), static_cast<pid_t>(ppid));
  }
  std::vector<pid_t> found{root};
  for (size_t i = 0; i < found.size(); ++i)
    for (const auto& [pid, ppid] : parent_of)
      if (ppid == found[i]) found.push_back(pid);
  found.erase(found.begin());
  return found;
}

// A probe that did not answer, and everything it started: mpirun puts its
// launch agent (ssh) in a process group of its own, so killing mpirun's
// group alone would leave the agent waiting for the unreachable host.
void kill_probe(pid_t pid) {
  const std::vector<pid_t> started = descendants(pid);
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  for (pid_t child : started) kill(child, SIGKILL);
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

// One probe under way: `mpirun --host HOST:1 -np 1 true`, its output in a file.
struct Probe {
  pid_t pid = -1;
  std::string output;  // a temporary file
  std::optional<int> status;
};

Probe start_probe(const std::string& host) {
  char path[] = "/tmp/dtrain-host-probe-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) throw std::runtime_error(std::string("cannot create a file for a host probe: ") + std::strerror(errno));
  std::vector<std::string> args{"mpirun"};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");
  args.insert(args.end(), {"--oversubscribe", "-np", "1", "--host", host + ":1", "true"});
  // Built before fork(): a probe may start while another thread allocates.
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    unlink(path);
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  }
  if (pid == 0) {
    setpgid(0, 0);  // its own group, so that signals for the launcher's job do not reach it
    const int null = open("/dev/null", O_RDONLY);
    dup2(null, STDIN_FILENO);  // mpirun would forward the launcher's stdin to the probe
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  setpgid(pid, pid);  // also here: kill(-pid) must find the group even if the child has not run yet
  close(fd);
  return {pid, path, std::nullopt};
}

// The first line of what a failed probe printed, for the log.
std::string first_line(const std::string& path) {
  std::ifstream file(path);
  for (std::string line; std::getline(file, line);) {
    line.erase(0, line.find_first_not_of(" \t-"));
    if (line.empty()) continue;
    if (line.size() > 160) line.replace(157, std::string::npos, "...");
    return line;
  }
  return "";
}

}  // namespace

std::vector<std::string> probe_hosts(const std::vector<HostSlots>& hosts) {
  using clock = std::chrono::steady_clock;
  const double timeout = probe_timeout_seconds();
  std::vector<Probe> probes;
  try {
    for (const auto& host : hosts) probes.push_back(start_probe(host.host));
  } catch (...) {
    for (auto& probe : probes) {
      kill_probe(probe.pid);
      unlink(probe.output.c_str());
    }
    throw;
  }
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(timeout));
  for (;;) {
    bool running = false;
    for (auto& probe : probes) {
      if (probe.status) continue;
      int status = 0;
      if (waitpid(probe.pid, &status, WNOHANG) == probe.pid)
        probe.status = status;
      else
        running = true;
    }
    if (!running || clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<std::string> why;
  for (auto& probe : probes) {
    std::ostringstream reason;
    if (!probe.status) {
      kill_probe(probe.pid);
      reason << "no answer within " << timeout << " s";
    } else if (!WIFEXITED(*probe.status) || WEXITSTATUS(*probe.status) != 0) {
      reason << "mpirun could not start a process there";
      if (const std::string said = first_line(probe.output); !said.empty()) reason << " (" << said << ")";
    }
    unlink(probe.output.c_str());
    why.push_back(reason.str());
  }
  return why;
}

RankRange parse_rank_range(const std::string& text, const std::string& flag) {
  const auto colon = text.find(':');
  RankRange range;
  const std::string low = text.substr(0, colon);
  const std::string high = colon == std::string::npos ? low : text.substr(colon + 1);
  const bool ok = parse_count(low, range.min) && parse_count(high, range.max);
  if (!ok || range.min > range.max)
    throw std::invalid_argument(flag + " must be N or MIN:MAX with 1 <= MIN <= MAX (e.g. 4, or 2:4 to go on with as "
                                "few as 2 ranks when hosts are lost), got '" + text + "'");
  return range;
}

std::string to_string(const RankRange& range) {
  return range.elastic() ? std::to_string(range.min) + ":" + std::to_string(range.max) : std::to_string(range.max);
}

std::vector<HostSlots> parse_hosts(const std::string& hosts) {
  std::vector<HostSlots> parsed;
  std::stringstream list(hosts);
  for (std::string entry; std::getline(list, entry, ',');) {
    const auto colon = entry.find(':');
    HostSlots host{entry.substr(0, colon), 0};
    if (host.host.empty() || host.host.find_first_of(" \t") != std::string::npos ||
        (colon != std::string::npos && !parse_count(entry.substr(colon + 1), host.slots)))
      throw std::invalid_argument("--hosts: '" + entry + "' needs HOST or HOST:SLOTS with SLOTS >= 1 (no spaces)");
    for (const auto& earlier : parsed)
      if (earlier.host == host.host) throw std::invalid_argument("--hosts: " + host.host + " is listed twice");
    parsed.push_back(host);
  }
  if (!hosts.empty() && hosts.back() == ',')
    throw std::invalid_argument("--hosts: '" + hosts + "' ends with a comma (HOST:SLOTS,HOST:SLOTS)");
  if (parsed.empty()) throw std::invalid_argument("--hosts: no host in '" + hosts + "' (HOST:SLOTS,...)");
  return parsed;
}

std::string to_string(const std::vector<HostSlots>& hosts) {
  std::string text;
  for (const auto& host : hosts)
    text += (text.empty() ? "" : ",") + host.host + (host.slots > 0 ? ":" + std::to_string(host.slots) : "");
  return text;
}

Placement place_elastic_job(const std::vector<HostSlots>& hosts, const RankRange& range) {
  const std::vector<std::string> why = probe_hosts(hosts);
  Placement placement;
  std::vector<HostSlots> used;
  int capacity = 0;
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (!why[i].empty()) {
      placement.lost.push_back(hosts[i]);
      placement.why.push_back(why[i]);
    } else if (capacity < range.max) {  // hosts past MAX's slots stay idle
      used.push_back(hosts[i]);
      capacity += hosts[i].slots;
    }
  }
  placement.nproc = std::min(capacity, range.max);
  placement.hosts = to_string(used);
  if (placement.nproc < range.min) {
    std::ostringstream message;
    message << "only " << capacity << (capacity == 1 ? " slot" : " slots") << " left on the hosts that answer ("
            << (used.empty() ? "none" : placement.hosts) << "), and --nproc " << to_string(range) << " needs at least "
            << range.min << ". Lost: ";
    for (size_t i = 0; i < placement.lost.size(); ++i)
      message << (i ? "; " : "") << placement.lost[i].host << " (" << placement.why[i] << ")";
    message << ". Bring a host back, or lower MIN, and run the job again (dtrain train: the same command with "
               "--resume)";
    throw std::runtime_error(message.str());
  }
  return placement;
}

std::string describe(const Placement& placement) {
  std::ostringstream line;
  line << placement.nproc << (placement.nproc == 1 ? " rank" : " ranks") << " on "
       << (placement.hosts.empty() ? "this machine" : placement.hosts);
  for (size_t i = 0; i < placement.lost.size(); ++i)
    line << (i ? "; " : " (lost: ") << to_string(std::vector<HostSlots>{placement.lost[i]}) << ", "
         << placement.why[i];
  if (!placement.lost.empty()) line << ")";
  return line.str();
}

GrowWatch::GrowWatch(const Placement& placement, const RankRange& range)
    : lost_(placement.lost),
      running_(placement.nproc),
      range_(range),
      interval_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(probe_interval_seconds()))),
      next_probe_(std::chrono::steady_clock::now() + interval_) {}

GrowWatch::~GrowWatch() {
  if (probe_.valid()) probe_.wait();  // a probe lasts DTRAIN_HOST_PROBE_TIMEOUT at most
}

std::optional<std::string> GrowWatch::poll() {
  if (lost_.empty() || running_ >= range_.max) return std::nullopt;
  const auto now = std::chrono::steady_clock::now();
  if (!probe_.valid()) {
    if (now >= next_probe_) probe_ = std::async(std::launch::async, [lost = lost_] { return probe_hosts(lost); });
    return std::nullopt;
  }
  if (probe_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return std::nullopt;
  next_probe_ = now + interval_;
  std::vector<std::string> why;
  try {
    why = probe_.get();
  } catch (const std::exception& error) {  // (fork or a temporary file failed): try again next time
    std::cerr << "dtrain launch: probing the lost hosts failed (" << error.what() << "); trying again in "
              << std::chrono::duration<double>(interval_).count() << " s" << std::endl;
    return std::nullopt;
  }
  std::vector<HostSlots> back;
  int slots = running_;
  for (size_t i = 0; i < lost_.size(); ++i)
    if (why[i].empty()) {
      back.push_back(lost_[i]);
      slots += lost_[i].slots;
    }
  if (back.empty()) return std::nullopt;
  lost_.clear();  // one resize per attempt; the next attempt probes every host again
  std::ostringstream message;
  message << to_string(back) << (back.size() == 1 ? " answers" : " answer") << " again: asking the job to stop "
          << "after its step with a checkpoint (SIGUSR1) to restart it on " << std::min(slots, range_.max) << " ranks";
  return message.str();
}

void check_probe_settings() {
  probe_timeout_seconds();
  probe_interval_seconds();
}

}  // namespace dtrain::cli
