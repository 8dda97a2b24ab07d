// The dtrain command line. Each subcommand lives in its own file; this one
// only declares flags and dispatches.
#include "bench_checkpoint.h"
#include "bench_collectives.h"
#include "bench_ddp.h"
#include "bench_fsdp.h"
#include "checkpoint.h"
#include "launch.h"
#include "plan.h"
#include "trace.h"
#include "train.h"

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

  dtrain::cli::BenchDDPOptions bench_ddp;
  auto* ddp_cmd = bench_cmd->add_subcommand("ddp", "Step time of dtrain DDP vs no communication and a naive all-reduce");
  ddp_cmd->add_option("--nproc", bench_ddp.nproc, "Number of ranks")->check(CLI::PositiveNumber);
  ddp_cmd->add_option("--backend", bench_ddp.backend, "mpi or c10d")->check(CLI::IsMember({"mpi", "c10d"}));
  ddp_cmd->add_option("--model", bench_ddp.model, "mlp (communication-bound), gpt (compute-bound) or all")
      ->check(CLI::IsMember({"mlp", "gpt", "all"}));
  ddp_cmd->add_option("--steps", bench_ddp.steps, "Timed steps per mode per round (default: mlp 20, gpt 4)")
      ->check(CLI::NonNegativeNumber);
  ddp_cmd->add_option("--rounds", bench_ddp.rounds, "Rounds in which the modes take turns")->check(CLI::PositiveNumber);
  ddp_cmd->add_option("--warmup", bench_ddp.warmup, "Untimed steps per mode first")->check(CLI::NonNegativeNumber);
  ddp_cmd->add_option("--json", bench_ddp.json_path, "Also write the results as JSON to this path");

  dtrain::cli::BenchFSDPOptions bench_fsdp;
  auto* fsdp_cmd = bench_cmd->add_subcommand(
      "fsdp", "Per-rank peak memory of DDP, ZeRO-1/2 and full sharding next to dtrain plan; FSDP vs DDP step time");
  fsdp_cmd->add_option("--parts", bench_fsdp.parts, "memory, speed (comma-separated)")
      ->delimiter(',')->check(CLI::IsMember({"memory", "speed"}))->capture_default_str();
  fsdp_cmd->add_option("--world-sizes", bench_fsdp.world_sizes, "Memory part: world sizes (comma-separated)")
      ->delimiter(',')->check(CLI::Range(1, 64))->capture_default_str();
  fsdp_cmd->add_option("--strategies", bench_fsdp.strategies, "Memory part: ddp, zero1, zero2, fsdp (comma-separated)")
      ->delimiter(',')->check(CLI::IsMember({"ddp", "zero1", "zero2", "fsdp"}))->capture_default_str();
  fsdp_cmd->add_option("--backend", bench_fsdp.backend, "mpi or c10d")->check(CLI::IsMember({"mpi", "c10d"}));
  fsdp_cmd->add_option("--memory-steps", bench_fsdp.memory_steps,
                       "Memory part: steps per run (the first builds the optimizer state; the peak is over the rest)")
      ->check(CLI::Range(2, 100))->capture_default_str();
  fsdp_cmd->add_option("--max-job-gib", bench_fsdp.max_job_gib,
                       "Memory part: skip runs whose ranks together are planned to need more (GiB)")
      ->check(CLI::Range(0.1, 1e6))->capture_default_str();
  fsdp_cmd->add_option("--speed-steps", bench_fsdp.speed_steps, "Speed part: timed steps per mode per round")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  fsdp_cmd->add_option("--rounds", bench_fsdp.rounds, "Speed part: rounds in which the modes take turns")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  fsdp_cmd->add_option("--warmup", bench_fsdp.warmup, "Speed part: untimed steps per mode first")
      ->check(CLI::Range(0, 1000))->capture_default_str();
  fsdp_cmd->add_option("--json", bench_fsdp.json_path, "Also write the results as JSON to this path");
  fsdp_cmd->add_option("--job", bench_fsdp.job, "(internal) the part a launched job runs")
      ->check(CLI::IsMember({"memory", "speed"}))->group("");
  fsdp_cmd->add_option("--job-json", bench_fsdp.job_json, "(internal) where the job writes its results")->group("");

  dtrain::cli::BenchCheckpointOptions bench_checkpoint;
  auto* checkpoint_bench_cmd = bench_cmd->add_subcommand(
      "checkpoint", "Sharded checkpoint save and load throughput (MB/s per rank) and resharding time");
  checkpoint_bench_cmd->add_option("--nproc", bench_checkpoint.nproc, "Number of ranks")->check(CLI::PositiveNumber);
  checkpoint_bench_cmd->add_option("--backend", bench_checkpoint.backend, "mpi or c10d")
      ->check(CLI::IsMember({"mpi", "c10d"}));
  checkpoint_bench_cmd->add_option("--layers", bench_checkpoint.layers, "GPT blocks")
      ->check(CLI::PositiveNumber)->capture_default_str();
  checkpoint_bench_cmd->add_option("--dim", bench_checkpoint.dim, "GPT width (a multiple of 8)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  checkpoint_bench_cmd->add_option("--rounds", bench_checkpoint.rounds, "Repetitions (the median is reported)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  checkpoint_bench_cmd->add_option("--dir", bench_checkpoint.dir, "Where to write the checkpoint (removed at the end)")
      ->capture_default_str();
  checkpoint_bench_cmd->add_option("--json", bench_checkpoint.json_path, "Also write the results as JSON to this path");

  dtrain::cli::PlanFlags plan_flags;
  auto* plan_cmd = dtrain::cli::add_plan_subcommand(app, plan_flags);

  auto* train_cmd = dtrain::cli::add_train_subcommand(app);

  dtrain::cli::TraceFlags trace_flags;
  auto* trace_summary_cmd = dtrain::cli::add_trace_subcommand(app, trace_flags);

  dtrain::cli::CheckpointFlags checkpoint_flags;
  const auto checkpoint_cmds = dtrain::cli::add_checkpoint_subcommand(app, checkpoint_flags);

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

  // train parses its own arguments (apps/dtrain/train.cpp) and reports its own errors.
  if (train_cmd->parsed()) return dtrain::cli::train_main(train_cmd->remaining());

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
    if (ddp_cmd->parsed()) {
      if (inside_launched_job()) return dtrain::cli::bench_ddp_rank(bench_ddp);
      // Re-run this command as the ranks of a job, one intra-op thread per
      // rank so that ranks x threads fit the cores and every mode computes alike.
      dtrain::cli::LaunchOptions job;
      job.nproc = bench_ddp.nproc;
      job.backend = bench_ddp.backend;
      job.threads_per_rank = 1;
      job.command = {dtrain::cli::self_executable(), "bench", "ddp", "--backend", bench_ddp.backend,
                     "--model", bench_ddp.model, "--steps", std::to_string(bench_ddp.steps),
                     "--rounds", std::to_string(bench_ddp.rounds), "--warmup", std::to_string(bench_ddp.warmup)};
      if (!bench_ddp.json_path.empty()) job.command.insert(job.command.end(), {"--json", bench_ddp.json_path});
      return dtrain::cli::launch(job);
    }
    if (checkpoint_bench_cmd->parsed()) {
      if (inside_launched_job()) return dtrain::cli::bench_checkpoint_rank(bench_checkpoint);
      dtrain::cli::LaunchOptions job;
      job.nproc = bench_checkpoint.nproc;
      job.backend = bench_checkpoint.backend;
      job.command = {dtrain::cli::self_executable(), "bench", "checkpoint", "--backend", bench_checkpoint.backend,
                     "--layers", std::to_string(bench_checkpoint.layers), "--dim", std::to_string(bench_checkpoint.dim),
                     "--rounds", std::to_string(bench_checkpoint.rounds), "--dir", bench_checkpoint.dir};
      if (!bench_checkpoint.json_path.empty()) job.command.insert(job.command.end(), {"--json", bench_checkpoint.json_path});
      return dtrain::cli::launch(job);
    }
    if (fsdp_cmd->parsed()) {
      if (inside_launched_job()) return dtrain::cli::bench_fsdp_rank(bench_fsdp);
      return dtrain::cli::bench_fsdp(bench_fsdp);
    }
    if (plan_cmd->parsed()) return dtrain::cli::plan_main(plan_flags);
    if (trace_summary_cmd->parsed()) return dtrain::cli::trace_summary_main(trace_flags);
    if (checkpoint_cmds.inspect->parsed()) return dtrain::cli::checkpoint_inspect(checkpoint_flags);
    if (checkpoint_cmds.export_->parsed()) return dtrain::cli::checkpoint_export(checkpoint_flags);
  } catch (const std::invalid_argument& error) {
    std::cerr << "dtrain: " << error.what() << std::endl;
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "dtrain: error: " << error.what() << std::endl;
    return 1;
  }
  return 0;
}
