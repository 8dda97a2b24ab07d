// `dtrain train`: its flags (also from --config FILE.toml), their checks, and
// where the job runs: in this process (one rank), as N local ranks that this
// command starts through launch(), or as one rank of a job a launcher started.
// The training itself is the library's run_training (dtrain/train.h).
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace dtrain::cli {

// Registers `train` on the dtrain command line. Its arguments are not
// parsed there: they pass through, untouched, to train_main().
CLI::App* add_train_subcommand(CLI::App& app);

// Runs `dtrain train ARGS`. Returns the process's exit code: 2 for invalid
// flags (before any rank starts), 1 for a failed run.
int train_main(const std::vector<std::string>& args);

}  // namespace dtrain::cli
