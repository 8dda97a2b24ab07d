#include "checkpoint.h"

#include <dtrain/checkpoint.h>
#include <dtrain/hugging_face.h>
#include <dtrain/model_spec.h>

#include <torch/torch.h>

#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <stdexcept>
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
  commands.export_->add_option("--to", flags.to, "Output .safetensors file (--format hf: a directory)")->required();
  commands.export_->add_option("--format", flags.format,
                               "safetensors (one file, dtrain's names) | hf (a Hugging Face model directory: config.json "
                               "and safetensors that transformers' from_pretrained loads; runs of a model whose spec has a Hugging Face "
                               "adapter, ModelSpec::hugging_face)")
      ->check(CLI::IsMember({"safetensors", "hf"}))->capture_default_str();
  commands.export_->add_option("--max-shard-size", flags.max_shard_size,
                               "--format hf: the largest safetensors file, in bytes or with KB, MB, GB (above it the "
                               "model is split into shards with model.safetensors.index.json)")
      ->capture_default_str();
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

namespace {

// "5GB", "200MB", "123" -> bytes (decimal units, as Hugging Face's max_shard_size).
int64_t parse_size(const std::string& text) {
  size_t used = 0;
  double number = 0;
  try {
    number = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  const std::map<std::string, double> units{{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}};
  const auto found = units.find(unit);
  if (used == 0 || found == units.end() || !(number * found->second >= 1))
    throw std::invalid_argument("--max-shard-size '" + text + "' is not a size such as 5GB, 200MB or 1000000");
  return static_cast<int64_t>(number * found->second);
}

// The checkpoint's model (by its registered spec's Hugging Face adapter)
// names and lays out the tensors; config.json is the one the run recorded.
int export_hugging_face(const CheckpointFlags& flags) {
  const auto manifest = read_checkpoint_manifest(flags.dir);
  const auto model = manifest.extra.find("model");
  const auto config = manifest.extra.find("hf_config");
  std::string readers;
  for (const std::string& name : model_names())
    if (find_model(name).hugging_face) readers += (readers.empty() ? "" : ", ") + name;
  if (model == manifest.extra.end() || config == manifest.extra.end())
    throw std::invalid_argument(flags.dir + " does not record a model with a Hugging Face layout (hf_config): --format "
                                "hf exports checkpoints of dtrain train --model " + readers +
                                " (a model whose spec has ModelSpec::hugging_face)");
  if (!has_model(model->second) || !find_model(model->second).hugging_face)
    throw std::invalid_argument(flags.dir + " was trained with --model " + model->second + ", which this program " +
                                (has_model(model->second) ? "registers without a Hugging Face adapter (ModelSpec::hugging_face)"
                                                          : "does not register (register_model, dtrain/model_spec.h)"));
  const HuggingFaceAdapter& adapter = *find_model(model->second).hugging_face;
  const int files = hf::export_checkpoint(flags.dir, flags.to, adapter.layout(), config->second,
                                          parse_size(flags.max_shard_size));
  std::cout << "wrote " << flags.to << ": config.json and " << files << (files == 1 ? " file" : " files") << " ("
            << model->second << ", step " << manifest.step << "); load it with transformers' " << adapter.architecture
            << ".from_pretrained(\"" << flags.to << "\")\n";
  return 0;
}

}  // namespace

int checkpoint_export(const CheckpointFlags& flags) {
  if (flags.format == "hf") return export_hugging_face(flags);
  const auto manifest = read_checkpoint_manifest(flags.dir);
  // One tensor in memory at a time: a model larger than this machine's memory exports too.
  const size_t written = export_checkpoint_safetensors(
      flags.dir, flags.to, {{"format", "pt"}, {"dtrain_step", std::to_string(manifest.step)}});
  std::cout << "wrote " << written << " tensors of step " << manifest.step << " to " << flags.to << "\n";
  return 0;
}

}  // namespace dtrain::cli
