// The dtrain command line, dtrain::cli::main (include/dtrain/cli.h). Each
// subcommand lives in its own file, which also declares its flags
// (add_*_subcommand); this one builds the tree and dispatches. The shipped
// dtrain (main.cpp) is this with the built-in models; a program that
// registers its own models first becomes a dtrain that trains them too.
#include "bench_checkpoint.h"
#include "bench_collectives.h"
#include "bench_ddp.h"
#include "bench_fp8.h"
#include "bench_fsdp.h"
#include "checkpoint.h"
#include "crash_report.h"
#include "launch.h"
#include "plan.h"
#include "tokenize.h"
#include "relaunch.h"
#include "trace.h"
#include "train.h"

#include "dtrain/cli.h"
#include "dtrain/comm.h"

#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <vector>

namespace {

// True when a launcher (mpirun, torchrun, dtrain launch) started this process.
bool inside_launched_job() { return dtrain::backend_from_environment() != "self"; }

}  // namespace

namespace dtrain::cli {

int main(int argc, char** argv) {
  report_fatal_signals();
  CLI::App app{"dtrain: distributed data-parallel training for LibTorch"};
  app.require_subcommand(1);

  dtrain::cli::LaunchFlags launch_flags;
  auto* launch_cmd = dtrain::cli::add_launch_subcommand(app, launch_flags);

  auto* bench_cmd = app.add_subcommand("bench", "Benchmarks");
  bench_cmd->require_subcommand(1);
  dtrain::cli::BenchCollectivesOptions bench;
  auto* collectives_cmd = dtrain::cli::add_bench_collectives_subcommand(*bench_cmd, bench);
  dtrain::cli::BenchDDPOptions bench_ddp;
  auto* ddp_cmd = dtrain::cli::add_bench_ddp_subcommand(*bench_cmd, bench_ddp);
  dtrain::cli::BenchFSDPOptions bench_fsdp;
  auto* fsdp_cmd = dtrain::cli::add_bench_fsdp_subcommand(*bench_cmd, bench_fsdp);
  dtrain::cli::BenchCheckpointOptions bench_checkpoint;
  auto* checkpoint_bench_cmd = dtrain::cli::add_bench_checkpoint_subcommand(*bench_cmd, bench_checkpoint);
  dtrain::cli::BenchFp8Options bench_fp8;
  auto* fp8_bench_cmd = dtrain::cli::add_bench_fp8_subcommand(*bench_cmd, bench_fp8);

  dtrain::cli::TokenizeFlags tokenize_flags;
  auto* tokenize_cmd = dtrain::cli::add_tokenize_subcommand(app, tokenize_flags);
  dtrain::cli::PlanFlags plan_flags;
  auto* plan_cmd = dtrain::cli::add_plan_subcommand(app, plan_flags);

  auto* train_cmd = dtrain::cli::add_train_subcommand(app);

  dtrain::cli::TraceFlags trace_flags;
  auto* trace_summary_cmd = dtrain::cli::add_trace_subcommand(app, trace_flags);

  dtrain::cli::CheckpointFlags checkpoint_flags;
  const auto checkpoint_cmds = dtrain::cli::add_checkpoint_subcommand(app, checkpoint_flags);

  const std::vector<std::string> words(argv + 1, argv + argc);  // this command, for relaunch_as_job
  dtrain::cli::split_off_launch_program(argc, argv, launch_flags);
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
    if (launch_cmd->parsed()) return dtrain::cli::launch_main(launch_flags);
    // Outside a launched job a benchmark re-runs itself as the ranks of one.
    if (collectives_cmd->parsed()) {
      if (inside_launched_job()) return dtrain::cli::bench_collectives_rank(bench);
      return dtrain::cli::relaunch_as_job(words, bench.nproc, bench.backend, bench.threads_per_rank, bench.hosts);
    }
    if (ddp_cmd->parsed()) {
      if (inside_launched_job()) return dtrain::cli::bench_ddp_rank(bench_ddp);
      // One intra-op thread per rank, so that ranks x threads fit the cores
      // and every mode computes alike.
      return dtrain::cli::relaunch_as_job(words, bench_ddp.nproc, bench_ddp.backend, /*threads_per_rank=*/1,
                                           bench_ddp.hosts);
    }
    if (checkpoint_bench_cmd->parsed()) {
      if (inside_launched_job()) return dtrain::cli::bench_checkpoint_rank(bench_checkpoint);
      return dtrain::cli::relaunch_as_job(words, bench_checkpoint.nproc, bench_checkpoint.backend);
    }
    if (fp8_bench_cmd->parsed()) return dtrain::cli::bench_fp8_main(bench_fp8);
    if (fsdp_cmd->parsed()) {
      if (inside_launched_job()) return dtrain::cli::bench_fsdp_rank(bench_fsdp);
      return dtrain::cli::bench_fsdp(bench_fsdp, words);
    }
    if (plan_cmd->parsed()) return dtrain::cli::plan_main(plan_flags);
    if (tokenize_cmd->parsed()) return dtrain::cli::tokenize_main(tokenize_flags);
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

}  // namespace dtrain::cli
