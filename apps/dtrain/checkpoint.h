// `dtrain checkpoint`: look inside and convert sharded checkpoints
// (include/dtrain/checkpoint.h).
//
//   dtrain checkpoint inspect DIR                      step, strategy, files (checked), tensors
//   dtrain checkpoint export DIR --to model.safetensors  full parameters, one file
//   dtrain checkpoint export DIR --to OUT --format hf     a Hugging Face model directory
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace dtrain::cli {

struct CheckpointFlags {
  std::string dir;
  std::string to;  // export: output file (or directory, --format hf)
  std::string format = "safetensors";     // export: safetensors | hf
  std::string max_shard_size = "5GB";     // export --format hf: the largest safetensors file
};

struct CheckpointCommands {
  CLI::App* inspect = nullptr;
  CLI::App* export_ = nullptr;
};

CheckpointCommands add_checkpoint_subcommand(CLI::App& app, CheckpointFlags& flags);

// Exit code 0, or 1 when inspect finds a damaged file.
int checkpoint_inspect(const CheckpointFlags& flags);
int checkpoint_export(const CheckpointFlags& flags);

}  // namespace dtrain::cli
