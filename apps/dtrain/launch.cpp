#include "launch.h"

#include "elastic.h"
#include "restarts.h"

#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace dtrain::cli {
namespace {

volatile sig_atomic_t g_forward_signal = 0;

void remember_signal(int signal_number) { g_forward_signal = signal_number; }

// SIGINT and SIGTERM (and for a rank's supervisor SIGUSR1, the elastic
// launcher's stop to resize, which mpirun passes on) are forwarded to the
// children by supervise().
void install_forwarding_handlers(bool forward_usr1 = false) {
  struct sigaction action {};
  action.sa_handler = remember_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  if (forward_usr1) sigaction(SIGUSR1, &action, nullptr);
}

// A port the kernel says is free now; the rank-0 TCPStore binds it moments later.
int pick_free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("cannot create a socket to pick a rendezvous port");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    close(fd);
    throw std::runtime_error("cannot pick a free rendezvous port on 127.0.0.1");
  }
  const int port = ntohs(address.sin_port);
  close(fd);
  return port;
}

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return std::string("was killed by signal ") + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

int exit_code_of(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

std::vector<char*> to_argv(std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  return argv;
}

// Forks a child that execs `args` with `env` added; the child dies with the launcher.
pid_t spawn(std::vector<std::string> args, const std::vector<std::pair<std::string, std::string>>& env) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid > 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);  // the launcher died before prctl took effect
  // A process group of its own: a Ctrl-C in the terminal reaches the launcher
  // alone, which forwards it once (the child would otherwise get it twice).
  setpgid(0, 0);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGUSR1, SIG_DFL);
  for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
  auto argv = to_argv(args);
  execvp(argv[0], argv.data());
  std::cerr << "dtrain launch: cannot run '" << args[0] << "': " << std::strerror(errno) << std::endl;
  _exit(127);
}

struct Child {
  std::string name;  // "rank 3", for messages
  pid_t pid;
  std::optional<int> status;
};

// DTRAIN_TIMEOUT in seconds as the ranks read it (default 300); a malformed
// value is left for the ranks to reject with their own message.
double rank_timeout_seconds() {
  const char* text = std::getenv("DTRAIN_TIMEOUT");
  if (text == nullptr || *text == '\0') return 300.0;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  return *end == '\0' && std::isfinite(seconds) && seconds > 0 ? seconds : 300.0;
}

// Asked while the job runs: a message when it should stop to be restarted on
// more ranks (elastic.h, GrowWatch), else nullopt.
using ResizeCheck = std::function<std::optional<std::string>()>;

// Waits for every child. After the first failure the others get SIGTERM, and
// SIGKILL once the grace period is over, so a job never outlives a dead rank.
// When `resize` asks for a stop, every child gets SIGUSR1 (dtrain train then
// saves a checkpoint at the end of its step and exits; mpirun forwards it to
// the ranks as it is, where a SIGTERM would be followed by mpirun's own
// SIGKILL a second later), and SIGKILL only after DTRAIN_TIMEOUT, time enough
// for that save; a forwarded SIGUSR1 likewise.
JobEnd supervise(std::vector<Child>& children, int grace_seconds, const ResizeCheck& resize = {}) {
  using clock = std::chrono::steady_clock;
  std::optional<int> first_failure;
  std::string failure;
  std::optional<clock::time_point> kill_deadline;
  // Once we forward a SIGINT/SIGTERM, deaths by it are the requested stop, not news.
  bool stop_requested = false;
  bool resize_requested = false;  // likewise for our own stop to grow
  auto signal_running = [&](int sig) {
    for (auto& child : children)
      if (!child.status) kill(-child.pid, sig);  // its whole process group (see spawn)
  };
  size_t finished = 0;
  while (finished < children.size()) {
    const auto resize_deadline = [&] {
      return clock::now() +
             std::chrono::seconds(static_cast<int64_t>(std::max<double>(grace_seconds, rank_timeout_seconds())));
    };
    if (g_forward_signal != 0) {
      const int sig = g_forward_signal;
      g_forward_signal = 0;
      signal_running(sig);
      stop_requested = true;
      const auto deadline = sig == SIGUSR1 ? resize_deadline() : clock::now() + std::chrono::seconds(grace_seconds);
      kill_deadline = kill_deadline ? std::min(*kill_deadline, deadline) : deadline;
    }
    if (kill_deadline && clock::now() > *kill_deadline) signal_running(SIGKILL);
    if (resize && !stop_requested && !resize_requested && !first_failure) {
      if (const std::optional<std::string> why = resize()) {
        std::cerr << "dtrain launch: " << *why << std::endl;
        signal_running(SIGUSR1);
        resize_requested = true;
        kill_deadline = resize_deadline();
      }
    }

    // Our children only: a host probe (elastic.h) may be running in another thread.
    int status = 0;
    auto child = children.end();
    for (auto it = children.begin(); it != children.end() && child == children.end(); ++it)
      if (!it->status && waitpid(it->pid, &status, WNOHANG) == it->pid) child = it;
    if (child == children.end()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    const pid_t pid = child->pid;
    child->status = status;
    ++finished;
    if (exit_code_of(status) == 0 || first_failure) continue;
    first_failure = exit_code_of(status);
    if (stop_requested || resize_requested) continue;
    failure = child->name + " (pid " + std::to_string(pid) + ") " + describe_status(status);
    std::cerr << "dtrain launch: " << failure;
    if (finished < children.size())
      std::cerr << "; stopping the other " << (children.size() - finished) << " (SIGTERM, SIGKILL after "
                << grace_seconds << " s)";
    std::cerr << std::endl;
    signal_running(SIGTERM);
    kill_deadline = clock::now() + std::chrono::seconds(grace_seconds);
  }
  return {.code = first_failure.value_or(0), .failure = failure, .stopped = stop_requested, .resized = resize_requested};
}

bool running_as_root() { return geteuid() == 0; }

// mpirun gives each rank a pseudo-terminal as stdout, even when the job's
// output goes to a file, so a rank cannot tell whether a person watches.
// DTRAIN_PROGRESS_LIVE=1|0 says it (dtrain train's live progress line); a
// value the user set is kept.
void tell_ranks_whether_stdout_is_a_terminal() {
  setenv("DTRAIN_PROGRESS_LIVE", isatty(STDOUT_FILENO) == 1 ? "1" : "0", /*overwrite=*/0);
}

// Like execvp's lookup: a name with a slash is a path, else it is searched on PATH.
bool find_executable(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');)
    if (access(((dir.empty() ? "." : dir) + "/" + name).c_str(), X_OK) == 0) return true;
  return false;
}

std::vector<std::pair<std::string, std::string>> thread_env(int threads) {
  const std::string t = std::to_string(threads);
  return {{"OMP_NUM_THREADS", t}, {"MKL_NUM_THREADS", t}, {"DTRAIN_THREADS_PER_RANK", t}};
}

JobEnd launch_c10d_local(const LaunchOptions& options, int threads, const Environment& job_env,
                         const ResizeCheck& resize) {
  const std::string port = std::to_string(pick_free_port());
  std::vector<Child> children;
  for (int rank = 0; rank < options.nproc; ++rank) {
    auto env = thread_env(threads);
    env.insert(env.end(), {{"RANK", std::to_string(rank)},
                           {"LOCAL_RANK", std::to_string(rank)},
                           {"WORLD_SIZE", std::to_string(options.nproc)},
                           {"LOCAL_WORLD_SIZE", std::to_string(options.nproc)},
                           {"MASTER_ADDR", "127.0.0.1"},
                           {"MASTER_PORT", port}});
    env.insert(env.end(), job_env.begin(), job_env.end());
    children.push_back({"rank " + std::to_string(rank), spawn(options.command, env), std::nullopt});
  }
  return supervise(children, options.grace_seconds, resize);
}


// mpirun learns that a host is gone (a cut link, a dead node) only from TCP
// keepalive on its daemon's connection: by default after 5 minutes idle and 9
// probes 20 s apart. And once a rank's watchdog has called MPI_Abort, mpirun
// waits for the unreachable daemon until TCP stops retransmitting (minutes).
// So across hosts, probe often enough to notice within about half of
// DTRAIN_TIMEOUT, before the watchdogs fire: mpirun then says it lost the
// host's daemon, names the host, and ends the job. Values the user set
// (OMPI_MCA_oob_tcp_keepalive_*) win. See tests/multihost/run_two_hosts.sh.
void detect_lost_hosts_before_the_watchdog(std::vector<std::string>& args) {
  const double timeout = std::min(rank_timeout_seconds(), 100000.0);  // TCP_KEEPIDLE caps at 32767 s
  const std::pair<std::string, int> settings[] = {
      {"oob_tcp_keepalive_time", std::max(1, static_cast<int>(timeout / 4))},
      {"oob_tcp_keepalive_intvl", std::max(1, static_cast<int>(timeout / 10))},
      {"oob_tcp_keepalive_probes", 3}};
  for (const auto& [name, value] : settings)
    if (!std::getenv(("OMPI_MCA_" + name).c_str())) args.insert(args.end(), {"--mca", name, std::to_string(value)});
}

// mpirun starts the ranks and ends the job when one fails. Each rank runs
// under `dtrain launch --supervise-rank` (supervise_rank below), which names
// a rank that died and how; mpirun's own message does not always say.
// The launcher adds what mpirun needs on a shared machine and forwards signals.
JobEnd launch_mpi(const LaunchOptions& options, int threads, const Environment& job_env, const ResizeCheck& resize) {
  std::vector<std::string> args{"mpirun"};
  // OpenMPI refuses to run as root unless told to.
  if (running_as_root()) args.push_back("--allow-run-as-root");
  // Ranks may outnumber cores (tests run 4 ranks on 2 cores); don't pin them
  // to cores either, since each rank sizes its own thread pool.
  args.insert(args.end(), {"--oversubscribe", "--bind-to", "none", "-np", std::to_string(options.nproc)});
  if (!options.hosts.empty()) {
    args.insert(args.end(), {"--host", options.hosts});
    detect_lost_hosts_before_the_watchdog(args);
  }
  for (const auto& [name, value] : thread_env(threads)) args.insert(args.end(), {"-x", name + "=" + value});
  for (const auto& [name, value] : job_env) args.insert(args.end(), {"-x", name + "=" + value});
  // Forward dtrain's own settings to every rank (mpirun only passes what -x names to remote hosts).
  for (const char* name : {"DTRAIN_TIMEOUT", "DTRAIN_DEBUG", "DTRAIN_PROGRESS_LIVE", "DTRAIN_MEMORY_CAP_MB", "DTRAIN_FAULT_DISK_BYTES",
                           "DTRAIN_TEST_KILL_AT_STEP", "DTRAIN_TEST_HANG_AT_STEP", "DTRAIN_TEST_SAMPLE_LOG", "DTRAIN_COMM_WAIT", "DTRAIN_COMM_MAX_SLEEP_US", "DTRAIN_COMM_NONBLOCKING_MIN_BYTES"})
    if (std::getenv(name)) args.insert(args.end(), {"-x", name});
  // Containers often forbid the cross-process memory attach (CMA) that the
  // shared-memory transport uses for large messages; copy-in/copy-out works everywhere.
  args.insert(args.end(), {"--mca", "btl_vader_single_copy_mechanism", "none"});
  args.insert(args.end(), {self_executable(), "launch", "--supervise-rank", "--"});
  args.insert(args.end(), options.command.begin(), options.command.end());
  std::vector<Child> children{{"mpirun", spawn(args, {}), std::nullopt}};
  return supervise(children, options.grace_seconds, resize);
}

// The ranks sharing one machine: the largest slot count on any host (a host
// without a slot count may get them all), at most the job's.
int ranks_per_host(const LaunchOptions& options) {
  if (options.hosts.empty()) return options.nproc;
  int most = 0;
  for (const auto& host : parse_hosts(options.hosts)) most = std::max(most, host.slots > 0 ? host.slots : options.nproc);
  return std::min(options.nproc, most);
}

}  // namespace

std::string self_executable() {
  char path[4096];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) return "dtrain";
  return std::string(path, static_cast<size_t>(length));
}

int supervise_rank(const std::vector<std::string>& command) {
  if (command.empty()) throw std::invalid_argument("--supervise-rank needs -- PROGRAM ARGS");
  char host[256] = "?";
  gethostname(host, sizeof(host) - 1);
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  install_forwarding_handlers(/*forward_usr1=*/true);
  std::vector<Child> children{
      {std::string("rank ") + (rank ? rank : "?") + " on " + host, spawn(command, {}), std::nullopt}};
  const JobEnd end = supervise(children, /*grace_seconds=*/10);
  // mpirun's own message names no rank; the restarting launcher reads this
  // (one line per failed rank, the first one first).
  const char* failures = std::getenv("DTRAIN_FAILURE_FILE");
  if (failures && *failures && !end.failure.empty()) std::ofstream(failures, std::ios::app) << end.failure + "\n";
  return end.code;
}

int default_threads_per_rank(int local_ranks) {
  // The cores this process may run on (affinity masks, cpusets), not the machine's.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  int cores = sched_getaffinity(0, sizeof(allowed), &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
  if (cores <= 0) cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / std::max(1, local_ranks));
}

int launch(const LaunchOptions& options) {
  if (options.command.empty()) throw std::invalid_argument("no program to launch: dtrain launch -n N -- PROGRAM ARGS");
  if (options.nproc < 1) throw std::invalid_argument("-n N (the number of ranks, at least 1) is required");
  if (options.backend != "mpi" && options.backend != "c10d")
    throw std::invalid_argument("--backend must be mpi or c10d, got '" + options.backend + "'");
  if (!options.hosts.empty() && options.backend != "mpi")
    throw std::invalid_argument("--hosts needs --backend mpi (for c10d across hosts, start each host with torchrun)");
  if (options.max_restarts < 0) throw std::invalid_argument("--max-restarts must be >= 0");
  if (options.max_restarts > 0 && options.checkpoint_dir.empty())
    throw std::invalid_argument("--max-restarts " + std::to_string(options.max_restarts) +
                                " restarts the job from its newest checkpoint: give the job's --checkpoint-dir DIR too "
                                "(without checkpoints there is nothing to restart from)");
  if (!find_executable(options.command.front()))
    throw std::invalid_argument("cannot find program '" + options.command.front() +
                                "' (not an executable file, nor on PATH)");
  if (options.backend == "mpi" && !find_executable("mpirun"))
    throw std::invalid_argument("mpirun is not installed: run scripts/setup (it installs openmpi-bin), or use --backend c10d");
  const RankRange range{options.min_nproc > 0 ? options.min_nproc : options.nproc, options.nproc};
  if (range.min > range.max)
    throw std::invalid_argument("--nproc " + std::to_string(range.min) + ":" + std::to_string(range.max) +
                                ": MIN must not exceed MAX");
  const std::vector<HostSlots> hosts = options.hosts.empty() ? std::vector<HostSlots>{} : parse_hosts(options.hosts);
  if (range.elastic() && hosts.empty())
    throw std::invalid_argument("--nproc " + to_string(range) + " resizes a job when hosts are lost or come back: give "
                                "--hosts HOST:SLOTS,... (ranks on one machine do not come and go; use -n N)");
  if (range.elastic()) check_probe_settings();
  for (const auto& host : hosts)
    if (range.elastic() && host.slots < 1)
      throw std::invalid_argument("--hosts: with --nproc " + to_string(range) + " every host needs its slot count "
                                  "(HOST:SLOTS, the ranks it runs), got '" + host.host + "'");
  if (range.elastic() && options.max_restarts == 0)
    throw std::invalid_argument("--nproc " + to_string(range) + " lets a restart run on fewer ranks: give --max-restarts K "
                                "and --checkpoint-dir DIR too (without restarts the job runs once)");
  tell_ranks_whether_stdout_is_a_terminal();
  install_forwarding_handlers();
  auto attempt = [&](const Environment& env) -> JobEnd {
    LaunchOptions placed = options;
    std::optional<GrowWatch> grow;
    if (range.elastic()) {
      try {
        const Placement placement = place_elastic_job(hosts, range);
        placed.nproc = placement.nproc;
        placed.hosts = placement.hosts;
        std::cerr << "dtrain launch: starting " << describe(placement) << std::endl;
        grow.emplace(placement, range);
        if (const int sig = g_forward_signal; sig != 0)  // Ctrl-C while the hosts were probed
          return {.code = 128 + sig, .failure = "", .stopped = true};
      } catch (const std::runtime_error& error) {
        std::cerr << "dtrain launch: cannot start the job: " << error.what() << std::endl;
        return {.code = 1, .failure = error.what(), .final = true};
      }
    }
    const ResizeCheck resize = grow ? ResizeCheck([&grow] { return grow->poll(); }) : ResizeCheck();
    const int threads =
        placed.threads_per_rank > 0 ? placed.threads_per_rank : default_threads_per_rank(ranks_per_host(placed));
    return placed.backend == "mpi" ? launch_mpi(placed, threads, env, resize)
                                   : launch_c10d_local(placed, threads, env, resize);
  };
  if (options.max_restarts == 0) return attempt({}).code;
  return run_with_restarts({.max_restarts = options.max_restarts, .checkpoint_dir = options.checkpoint_dir}, attempt);
}

CLI::App* add_launch_subcommand(CLI::App& app, LaunchFlags& flags) {
  auto& launch = flags.options;
  auto* cmd = app.add_subcommand("launch", "Start N ranks of a program (locally, or across hosts via mpirun)");
  cmd->add_option("-n,--nproc", flags.nproc,
                  "Number of ranks (required): N, or MIN:MAX with --hosts and --max-restarts to restart on the hosts "
                  "that remain when one is lost (at least MIN ranks) and grow back up to MAX when it returns");
  cmd->add_option("--backend", launch.backend, "How ranks find each other: mpi (mpirun) or c10d (torchrun-style)")
      ->check(CLI::IsMember({"mpi", "c10d"}));
  cmd->add_option("--hosts", launch.hosts, "HOST:SLOTS,... for a multi-host mpi job");
  cmd->add_option("--threads-per-rank", launch.threads_per_rank, "Intra-op threads per rank (default: cores / local ranks)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-restarts", launch.max_restarts,
                  "Restart the job up to K times when a rank fails, from the newest checkpoint in --checkpoint-dir "
                  "(ranks get DTRAIN_RESTART_COUNT; dtrain train then resumes by itself)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--checkpoint-dir", launch.checkpoint_dir,
                  "With --max-restarts: the job's checkpoint folder (the program's own --checkpoint-dir), to name "
                  "the checkpoint a restart continues from and to stop a job that no longer makes progress");
  cmd->add_flag("--supervise-rank", flags.supervise_rank, "(internal) run one rank of an mpirun job")->group("");
  // Everything after "--" belongs to the program (split off before parsing,
  // so its flags never reach CLI11); without "--", plain words are accepted.
  cmd->add_option("command", launch.command, "PROGRAM [ARGS...] (put -- before it if ARGS have flags)");
  cmd->footer("Usage: dtrain launch -n N [options] -- PROGRAM [ARGS...]");
  return cmd;
}

void split_off_launch_program(int& argc, char** argv, LaunchFlags& flags) {
  if (argc < 2 || std::string(argv[1]) != "launch") return;
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) != "--") continue;
    flags.program_after_dashes.assign(argv + i + 1, argv + argc);
    argc = i;
    return;
  }
}

int launch_main(LaunchFlags& flags) {
  auto& launch_options = flags.options;
  if (!flags.program_after_dashes.empty()) {
    if (!launch_options.command.empty())
      throw std::invalid_argument("unexpected '" + launch_options.command.front() + "' before --");
    launch_options.command = flags.program_after_dashes;
  }
  if (flags.supervise_rank) return supervise_rank(launch_options.command);
  if (!flags.nproc.empty()) {
    const RankRange range = parse_rank_range(flags.nproc, "-n/--nproc");
    launch_options.nproc = range.max;
    launch_options.min_nproc = range.min;
  }
  return launch(launch_options);
}

}  // namespace dtrain::cli
