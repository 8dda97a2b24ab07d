// --init-from for a sharded model: each rank reads from the safetensors file
// only the bytes of the pieces it holds (include/dtrain/checkpoint.h,
// load_safetensors_into), so no rank ever holds the whole file.
#include "checkpoint/held_state.h"
#include "checkpoint/rank_file_reader.h"
#include "checkpoint/state_fit.h"

#include <dtrain/checkpoint.h>
#include <dtrain/fsdp.h>
#include <dtrain/hugging_face.h>

#include <torch/types.h>
#include <torch/utils.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain {
namespace {

// One tensor this rank fills: the elements `runs` lists of the flattened
// tensor `name` of full shape `shape`, in order.
struct Target {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<FlatRun> runs;
  torch::Tensor destination;  // contiguous
};

// Names, shapes and dtypes against the file's header, all before anything
// is read (the checks and messages of load_state_into).
void check_fits(const detail::RankFileReader& reader, const std::vector<Target>& targets) {
  std::vector<detail::TensorSignature> model, file;
  for (const auto& target : targets) model.push_back({target.name, target.shape, target.destination.scalar_type()});
  for (const auto& entry : reader.header().tensors)
    file.push_back({entry.name, entry.shape, detail::torch_dtype_of(entry.dtype)});
  detail::check_state_fits(reader.path(), model, file);
}

}  // namespace

void load_safetensors_into(const HeldModel& held, const std::string& path) {
  // A Hugging Face model directory names its tensors as the model's spec says.
  if (hf::is_model_directory(path))
    throw std::runtime_error(path + " is a Hugging Face model directory: load it with hf::load_into and the model's "
                             "hf::Layout (dtrain/hugging_face.h; ModelSpec::hugging_face)");
  torch::NoGradGuard no_grad;
  const detail::RankFileReader reader(path);
  std::vector<Target> targets;
  for (const auto& tensor : held.tensors) targets.push_back({tensor.name, tensor.shape, detail::global_runs(tensor), tensor.flat});
  check_fits(reader, targets);
  std::map<std::string, torch::ScalarType> file_dtypes;
  for (const auto& entry : reader.header().tensors) file_dtypes[entry.name] = detail::torch_dtype_of(entry.dtype);
  for (auto& target : targets) {
    if (target.destination.numel() == 0) continue;
    const auto file_type = file_dtypes.at(target.name);
    const bool direct = file_type == target.destination.scalar_type() && target.destination.is_contiguous();
    // A piece in another dtype is read into a buffer of its own size first.
    auto staging = direct ? target.destination
                          : torch::empty({target.destination.numel()}, target.destination.options().dtype(file_type));
    for_each_range(target.runs, [&](int64_t begin, int64_t end, int64_t position) {
      reader.read(target.name, begin, staging.narrow(0, position, end - begin));
    });
    if (!direct) target.destination.copy_(staging.view(target.destination.sizes()));
  }
}

void load_safetensors_into(FullyShardedBase& fsdp, const std::string& path) {
  load_safetensors_into(detail::held_by_fsdp(fsdp), path);
}

void check_safetensors_fits(const torch::nn::Module& module, const std::string& path) {
  const detail::RankFileReader reader(path);
  std::vector<Target> targets;
  for (const auto& item : module.named_parameters(true)) targets.push_back({item.key(), item.value().sizes().vec(), {}, item.value()});
  for (const auto& item : module.named_buffers(true)) {
    if (item.value().defined()) targets.push_back({item.key(), item.value().sizes().vec(), {}, item.value()});
  }
  check_fits(reader, targets);
}

}  // namespace dtrain
