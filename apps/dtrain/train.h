// `dtrain train`: its flags (also from --config FILE.toml), their checks, and
// where the job runs: in this process (one rank), as N local ranks that this
// command starts through launch(), or as one rank of a job a launcher started.
// The training itself is the library's run_training (dtrain/train.h).
#pragma once

#include <CLI/CLI.hpp>

#include <map>
#include <string>
#include <vector>

namespace dtrain::cli {

// --model's check: a name in the model registry (dtrain/model_spec.h).
extern const CLI::Validator kRegisteredModel;
// --model-option KEY=VALUE (repeatable) into `options`: settings for a model
// of one's own (dtrain train and dtrain plan).
CLI::Option* add_model_options(CLI::App& app, std::map<std::string, std::string>& options);

// Registers `train` on the dtrain command line. Its arguments are not
// parsed there: they pass through, untouched, to train_main().
CLI::App* add_train_subcommand(CLI::App& app);

// `dtrain train ARGS` parsed and checked as it checks before any rank
// starts, for a job of `nproc` ranks, without running anything; throws
// std::invalid_argument with the message train would print (dtrain plan
// --search lists only layouts this accepts).
void check_train_flags(const std::vector<std::string>& args, int nproc);

// Runs `dtrain train ARGS`. Returns the process's exit code: 2 for invalid
// flags (before any rank starts), 1 for a failed run.
int train_main(const std::vector<std::string>& args);

}  // namespace dtrain::cli
