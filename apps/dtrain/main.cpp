// The dtrain command line. Each subcommand lives in its own file; this one
// only declares flags and dispatches.
#include "bench_collectives.h"
#include "launch.h"

#include "dtrain/comm.h"

#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <vector>

namespace {

// True when a launcher (mpirun, torchrun, dtrain launch) started this process.
bool inside_launched_job() { return dtrain::backend_from_environment() != "self"; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain: distributed data-parallel training for LibTorch"};
  app.require_subcommand(1);

  dtrain::cli::LaunchOptions launch;
  auto* launch_cmd = app.add_subcommand("launch", "Start N ranks of a program (locally, or across hosts via mpirun)");
  launch_cmd->add_option("-n,--nproc", launch.nproc, "Number of ranks (required)")->check(CLI::PositiveNumber);
  launch_cmd->add_option("--backend", launch.backend, "How ranks find each other: mpi (mpirun) or c10d (torchrun-style)")
      ->check(CLI::IsMember({"mpi", "c10d"}));
  launch_cmd->add_option("--hosts", launch.hosts, "HOST:SLOTS,... for a multi-host mpi job");
  launch_cmd->add_option("--threads-per-rank", launch.threads_per_rank,
                         "Intra-op threads per rank (default: cores / local ranks)")
      ->check(CLI::NonNegativeNumber);
  bool supervise_rank = false;
  launch_cmd->add_flag("--supervise-rank", supervise_rank, "(internal) run one rank of an mpirun job")->group("");
  // Everything after "--" belongs to the program (split off before parsing,
  // so its flags never reach CLI11); without "--", plain words are accepted.
  launch_cmd->add_option("command", launch.command, "PROGRAM [ARGS...] (put -- before it if ARGS have flags)");
  launch_cmd->footer("Usage: dtrain launch -n N [options] -- PROGRAM [ARGS...]");

  auto* bench_cmd = app.add_subcommand("bench", "Benchmarks");
  bench_cmd->require_subcommand(1);
  dtrain::cli::BenchCollectivesOptions bench;
  auto* collectives_cmd = bench_cmd->add_subcommand("collectives", "Bus bandwidth of dtrain's collectives vs the raw backend");
  collectives_cmd->add_option("--nproc", bench.nproc, "Number of ranks")->check(CLI::PositiveNumber);
  collectives_cmd->add_option("--backend", bench.backend, "mpi or c10d")->check(CLI::IsMember({"mpi", "c10d"}));
  collectives_cmd->add_option("--json", bench.json_path, "Also write the results as JSON to this path");
  collectives_cmd->add_option("--max-bytes", bench.max_bytes, "Largest message in bytes (default 256 MiB)")
      ->check(CLI::Range(int64_t{4} << 10, int64_t{4} << 30));

  std::vector<std::string> program_after_dashes;
  if (argc > 1 && std::string(argv[1]) == "launch") {
    for (int i = 2; i < argc; ++i) {
      if (std::string(argv[i]) != "--") continue;
      program_after_dashes.assign(argv + i + 1, argv + argc);
      argc = i;
      break;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // CLI11 exits 0 for --help and 106 etc. for errors; usage errors exit 2.
    const int code = app.exit(error);
    if (code != 0 && launch_cmd->parsed())
      std::cerr << "dtrain launch: options go before the program; put -- before it: "
                   "dtrain launch -n N [options] -- PROGRAM [ARGS...]" << std::endl;
    return code == 0 ? 0 : 2;
  }

  try {
    if (launch_cmd->parsed()) {
      if (!program_after_dashes.empty()) {
        if (!launch.command.empty())
          throw std::invalid_argument("unexpected '" + launch.command.front() + "' before --");
        launch.command = program_after_dashes;
      }
      if (supervise_rank) return dtrain::cli::supervise_rank(launch.command);
      return dtrain::cli::launch(launch);
    }
    if (collectives_cmd->parsed()) {
      if (inside_launched_job()) return dtrain::cli::bench_collectives_rank(bench);
      // Re-run this command as the ranks of a job.
      dtrain::cli::LaunchOptions job;
      job.nproc = bench.nproc;
      job.backend = bench.backend;
      job.command = {dtrain::cli::self_executable(), "bench", "collectives", "--backend", bench.backend,
                     "--max-bytes", std::to_string(bench.max_bytes)};
      if (!bench.json_path.empty()) job.command.insert(job.command.end(), {"--json", bench.json_path});
      return dtrain::cli::launch(job);
    }
  } catch (const std::invalid_argument& error) {
    std::cerr << "dtrain: " << error.what() << std::endl;
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "dtrain: error: " << error.what() << std::endl;
    return 1;
  }
  return 0;
}
