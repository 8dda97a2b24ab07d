#include "checkpoint.h"

#include <dtrain/checkpoint.h>

#include <torch/torch.h>

#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace dtrain::cli {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

}  // namespace

CheckpointCommands add_checkpoint_subcommand(CLI::App& app, CheckpointFlags& flags) {
  auto* command = app.add_subcommand("checkpoint", "Inspect or export a sharded checkpoint directory");
  command->require_subcommand(1);
  CheckpointCommands commands;
  commands.inspect = command->add_subcommand("inspect", "Print step, strategy, files (checksums verified) and tensors");
  commands.inspect->add_option("dir", flags.dir, "Checkpoint directory")->required();
  commands.export_ = command->add_subcommand("export", "Write the full (unsharded) parameters to one safetensors file");
  commands.export_->add_option("dir", flags.dir, "Checkpoint directory")->required();
  commands.export_->add_option("--to", flags.to, "Output .safetensors file")->required();
  return commands;
}

int checkpoint_inspect(const CheckpointFlags& flags) {
  const auto manifest = read_checkpoint_manifest(flags.dir);
  std::cout << "checkpoint " << flags.dir << "\n"
            << "  step        " << manifest.step << "\n"
            << "  strategy    " << manifest.strategy << "\n"
            << "  world size  " << manifest.world_size << "\n"
            << "  optimizer   " << manifest.optimizer << "\n";
  // Long values (a rank's random state) are shortened: they are for the loader, not for reading.
  for (const auto& [key, value] : manifest.extra) {
    std::cout << "  extra       " << key << " = ";
    if (value.size() > 64)
      std::cout << value.substr(0, 16) << "... (" << value.size() << " characters)\n";
    else
      std::cout << value << "\n";
  }
  const auto problems = verify_checkpoint_files(flags.dir, manifest);
  std::cout << "files:\n";
  for (const auto& file : manifest.files) {
    std::string status = "ok";
    for (const auto& problem : problems) {
      if (problem.rfind(file.name + ":", 0) == 0) status = "DAMAGED (" + problem.substr(file.name.size() + 2) + ")";
    }
    std::cout << "  " << file.name << "  " << file.bytes << " bytes  " << file.pieces.size() << " pieces  xxh64 "
              << std::hex << std::setw(16) << std::setfill('0') << file.xxh64 << std::dec << std::setfill(' ') << "  "
              << status << "\n";
  }
  std::cout << "tensors:\n";
  for (const auto& [name, tensor] : manifest.tensors) {
    std::cout << "  " << name << "  " << tensor.dtype << " " << shape_text(tensor.shape) << "\n";
  }
  if (!problems.empty()) {
    std::cerr << "dtrain checkpoint inspect: " << problems.size() << " damaged file(s); this checkpoint will not load"
              << std::endl;
    return 1;
  }
  return 0;
}

int checkpoint_export(const CheckpointFlags& flags) {
  const auto manifest = read_checkpoint_manifest(flags.dir);
  // One tensor in memory at a time: a model larger than this machine's memory exports too.
  const size_t written = export_checkpoint_safetensors(
      flags.dir, flags.to, {{"format", "pt"}, {"dtrain_step", std::to_string(manifest.step)}});
  std::cout << "wrote " << written << " tensors of step " << manifest.step << " to " << flags.to << "\n";
  return 0;
}

}  // namespace dtrain::cli
