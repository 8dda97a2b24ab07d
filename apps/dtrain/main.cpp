// The dtrain command line. Each subcommand lives in its own file; this one
// only declares flags and dispatches.
#include "bench_collectives.h"
#include "launch.h"

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>
#include <string>
#include <unistd.h>

namespace {

// True when a launcher (mpirun, torchrun, dtrain launch) started this process.
bool inside_launched_job() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "RANK"})
    if (const char* value = std::getenv(name); value && *value) return true;
  return false;
}

std::string self_executable() {
  char path[4096];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) return "dtrain";
  return std::string(path, static_cast<size_t>(length));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain: distributed data-parallel training for LibTorch"};
  app.require_subcommand(1);

  dtrain::cli::LaunchOptions launch;
  auto* launch_cmd = app.add_subcommand("launch", "Start N ranks of a program (locally, or across hosts via mpirun)");
  launch_cmd->add_option("-n,--nproc", launch.nproc, "Number of ranks")->required()->check(CLI::PositiveNumber);
  launch_cmd->add_option("--backend", launch.backend, "How ranks find each other: mpi (mpirun) or c10d (torchrun-style)")
      ->check(CLI::IsMember({"mpi", "c10d"}));
  launch_cmd->add_option("--hosts", launch.hosts, "HOST:SLOTS,... for a multi-host mpi job");
  launch_cmd->add_option("--threads-per-rank", launch.threads_per_rank,
                         "Intra-op threads per rank (default: cores / local ranks)")
      ->check(CLI::NonNegativeNumber);
  launch_cmd->add_option("command", launch.command, "-- PROGRAM ARGS...")->required();

  auto* bench_cmd = app.add_subcommand("bench", "Benchmarks");
  bench_cmd->require_subcommand(1);
  dtrain::cli::BenchCollectivesOptions bench;
  auto* collectives_cmd = bench_cmd->add_subcommand("collectives", "Bus bandwidth of dtrain's collectives vs the raw backend");
  collectives_cmd->add_option("--nproc", bench.nproc, "Number of ranks")->check(CLI::PositiveNumber);
  collectives_cmd->add_option("--backend", bench.backend, "mpi or c10d")->check(CLI::IsMember({"mpi", "c10d"}));
  collectives_cmd->add_option("--json", bench.json_path, "Also write the results as JSON to this path");
  collectives_cmd->add_option("--max-bytes", bench.max_bytes, "Largest message in bytes (default 256 MiB)")
      ->check(CLI::PositiveNumber);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // CLI11 exits 0 for --help and 106 etc. for errors; usage errors exit 2.
    const int code = app.exit(error);
    return code == 0 ? 0 : 2;
  }

  try {
    if (launch_cmd->parsed()) return dtrain::cli::launch(launch);
    if (collectives_cmd->parsed()) {
      if (inside_launched_job()) return dtrain::cli::bench_collectives_rank(bench);
      // Re-run this command as the ranks of a job.
      dtrain::cli::LaunchOptions job;
      job.nproc = bench.nproc;
      job.backend = bench.backend;
      job.command = {self_executable(), "bench", "collectives", "--backend", bench.backend,
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
