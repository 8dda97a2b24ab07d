// --init-from for a sharded model: each rank reads from the safetensors file
// only the bytes of the pieces it holds (include/dtrain/checkpoint.h,
// load_safetensors_into), so no rank ever holds the whole file.
#include "checkpoint/rank_file_reader.h"

#include <dtrain/checkpoint.h>
#include <dtrain/fsdp.h>

#include <torch/types.h>
#include <torch/utils.h>

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain {
namespace {

namespace st = safetensors;

std::optional<torch::ScalarType> torch_dtype_of(st::DType dtype) {
  switch (dtype) {
    case st::DType::F16: return torch::kFloat16;
    case st::DType::BF16: return torch::kBFloat16;
    case st::DType::F32: return torch::kFloat32;
    case st::DType::F64: return torch::kFloat64;
    case st::DType::I64: return torch::kInt64;
    case st::DType::I32: return torch::kInt32;
    case st::DType::I16: return torch::kInt16;
    case st::DType::I8: return torch::kInt8;
    case st::DType::U8: return torch::kUInt8;
    case st::DType::BOOL: return torch::kBool;
    default: return std::nullopt;
  }
}

// Exact conversions only (as load_state_into).
bool widens(torch::ScalarType from, torch::ScalarType to) {
  if (from == to) return true;
  const bool half = from == torch::kFloat16 || from == torch::kBFloat16;
  if (half && (to == torch::kFloat32 || to == torch::kFloat64)) return true;
  return from == torch::kFloat32 && to == torch::kFloat64;
}

// One tensor this rank fills: elements [begin, begin + destination.numel())
// of the flattened tensor `name` of full shape `shape`.
struct Target {
  std::string name;
  std::vector<int64_t> shape;
  int64_t begin = 0;
  torch::Tensor destination;  // contiguous
};

std::string list_some(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size() && i < 5; ++i) text += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > 5) text += " and " + std::to_string(names.size() - 5) + " more";
  return text;
}

// Names, shapes and dtypes, all checked before anything is read.
void check_fits(const detail::RankFileReader& reader, const std::vector<Target>& targets) {
  std::map<std::string, const st::TensorEntry*> in_file;
  for (const auto& entry : reader.header().tensors) in_file[entry.name] = &entry;
  std::vector<std::string> file_lacks, model_lacks;
  std::map<std::string, bool> in_model;
  for (const auto& target : targets) {
    in_model[target.name] = true;
    if (!in_file.count(target.name)) file_lacks.push_back(target.name);
  }
  for (const auto& [name, entry] : in_file)
    if (!in_model.count(name)) model_lacks.push_back(name);
  if (!file_lacks.empty() || !model_lacks.empty()) {
    std::string message = reader.path() + " does not fit the model:";
    if (!file_lacks.empty())
      message += " the model's " + list_some(file_lacks) + (file_lacks.size() == 1 ? " is" : " are") + " missing from the file";
    if (!file_lacks.empty() && !model_lacks.empty()) message += ";";
    if (!model_lacks.empty())
      message += " the file's " + list_some(model_lacks) + (model_lacks.size() == 1 ? " is" : " are") + " not in the model";
    throw std::runtime_error(message + " (the file holds " + std::to_string(in_file.size()) + " tensors, the model " +
                             std::to_string(targets.size()) + ")");
  }
  for (const auto& target : targets) {
    const auto& entry = *in_file.at(target.name);
    if (entry.shape != target.shape)
      throw std::runtime_error(reader.path() + ": tensor '" + target.name + "' has shape " +
                               c10::str(c10::IntArrayRef(entry.shape)) + " in the file but " +
                               c10::str(c10::IntArrayRef(target.shape)) + " in the model");
    const auto dtype = torch_dtype_of(entry.dtype);
    if (!dtype || !widens(*dtype, target.destination.scalar_type()))
      throw std::runtime_error(reader.path() + ": tensor '" + target.name + "' is " + st::dtype_name(entry.dtype) +
                               " in the file but " + dtype_name(target.destination.scalar_type()) +
                               " in the model (only widening float16/bfloat16/float32 is converted)");
  }
}

}  // namespace

void load_safetensors_into(FullyShardedBase& fsdp, const std::string& path) {
  torch::NoGradGuard no_grad;
  const detail::RankFileReader reader(path);
  std::vector<Target> targets;
  for (const auto& shard : fsdp.parameter_shards()) {
    targets.push_back({shard.name, shard.shape, shard.begin, shard.parameter});
  }
  for (const auto& item : fsdp.root_module()->named_buffers(true)) {
    if (item.value().defined()) targets.push_back({item.key(), item.value().sizes().vec(), 0, item.value()});
  }
  check_fits(reader, targets);
  std::map<std::string, const st::TensorEntry*> in_file;
  for (const auto& entry : reader.header().tensors) in_file[entry.name] = &entry;
  for (auto& target : targets) {
    if (target.destination.numel() == 0) continue;
    const auto file_type = *torch_dtype_of(in_file.at(target.name)->dtype);
    const bool direct = file_type == target.destination.scalar_type() && target.destination.is_contiguous();
    // A piece in another dtype is read into a buffer of its own size first.
    auto staging = direct ? target.destination
                          : torch::empty({target.destination.numel()}, target.destination.options().dtype(file_type));
    reader.read(target.name, target.begin, staging);
    if (!direct) target.destination.copy_(staging.view(target.destination.sizes()));
  }
}

void check_safetensors_fits(const torch::nn::Module& module, const std::string& path) {
  const detail::RankFileReader reader(path);
  std::vector<Target> targets;
  for (const auto& item : module.named_parameters(true)) targets.push_back({item.key(), item.value().sizes().vec(), 0, item.value()});
  for (const auto& item : module.named_buffers(true)) {
    if (item.value().defined()) targets.push_back({item.key(), item.value().sizes().vec(), 0, item.value()});
  }
  check_fits(reader, targets);
}

}  // namespace dtrain
