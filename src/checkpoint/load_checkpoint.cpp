// Sharded load with resharding: each rank reads, for each piece it holds,
// the saved pieces that overlap it, whatever world size and strategy wrote
// them. Everything is read and checked before anything is copied, so a
// failed load leaves model and optimizer as they were.
#include "checkpoint/held_state.h"
#include "checkpoint/manifest.h"
#include "checkpoint/rank_agreement.h"
#include "checkpoint/rank_file_reader.h"

#include <dtrain/checkpoint.h>
#include <dtrain/fsdp.h>

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>

namespace dtrain {
namespace {

namespace fs = std::filesystem;

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Reads elements of the checkpoint's tensors from the rank files (only the
// bytes each range needs; each file's header parsed once). A tensor's saved
// ranges are listed when it is first read (a strided piece lists one range
// per run) and sorted, so each wanted range finds its overlaps by binary search.
class CheckpointReader {
 public:
  CheckpointReader(std::string dir, const CheckpointManifest& manifest) : dir_(std::move(dir)), manifest_(manifest) {
    for (size_t f = 0; f < manifest_.files.size(); ++f) {
      for (const auto& piece : manifest_.files[f].pieces) pieces_of_[piece.name].push_back({f, &piece});
    }
    files_.resize(manifest_.files.size());
  }

  // Elements [begin, end) of the flattened tensor `name`, as a 1-D tensor.
  torch::Tensor read(const std::string& name, int64_t begin, int64_t end, torch::ScalarType dtype) {
    return read(name, {{begin, end - begin, 0, 1}}, dtype);
  }

  // The elements `runs` lists, in order, as a 1-D tensor.
  torch::Tensor read(const std::string& name, const std::vector<FlatRun>& runs, torch::ScalarType dtype) {
    const std::vector<Saved>& saved = ranges_of(name);
    auto out = torch::empty({numel_of(runs)}, dtype);
    int64_t covered = 0;
    for_each_range(runs, [&](int64_t begin, int64_t end, int64_t position) {
      // The first saved range that ends after `begin`; ranges do not overlap.
      auto it = std::upper_bound(saved.begin(), saved.end(), begin,
                                 [](int64_t value, const Saved& range) { return value < range.end; });
      for (; it != saved.end() && it->begin < end; ++it) {
        const int64_t lo = std::max(begin, it->begin), hi = std::min(end, it->end);
        // Elements [lo, hi) straight from the file: the range starts at
        // it->begin, at element it->offset of the file's entry.
        file(it->file).read(name, it->offset + (lo - it->begin), out.narrow(0, position + (lo - begin), hi - lo));
        covered += hi - lo;
      }
    });
    if (covered != out.numel()) {
      throw std::runtime_error(dir_ + ": the rank files hold " + std::to_string(covered) + " of the " +
                               std::to_string(out.numel()) + " elements of '" + name +
                               "' this rank reads (checkpoint incomplete or inconsistent)");
    }
    return out;
  }

 private:
  struct Saved {
    int64_t begin, end;  // elements of the flattened tensor
    size_t file;
    int64_t offset;      // of `begin` in the file's entry
  };

  const std::vector<Saved>& ranges_of(const std::string& name) {
    if (name == listed_name_) return listed_;
    listed_.clear();
    listed_name_.clear();
    std::map<size_t, int64_t> entry;  // per file: the elements its entry for `name` holds
    for (const auto& [f, piece] : pieces_of_[name]) {
      const int64_t length = piece->end - piece->begin;
      for (int64_t k = 0; k < piece->count && length > 0; ++k) {
        listed_.push_back({piece->begin + k * piece->stride, piece->end + k * piece->stride, f, piece->offset + k * length});
      }
      entry[f] += piece->numel();
    }
    // Each entry holds what its pieces say (verify_files checked the
    // headers; this guards a reader used without it).
    for (const auto& [f, elements] : entry) {
      if (elements > 0 && file(f).numel(name) != elements) {
        throw std::runtime_error(manifest_.files[f].name + ": '" + name + "' has " + std::to_string(file(f).numel(name)) +
                                 " elements, the manifest says " + std::to_string(elements));
      }
    }
    std::sort(listed_.begin(), listed_.end(), [](const Saved& a, const Saved& b) { return a.begin < b.begin; });
    listed_name_ = name;
    return listed_;
  }

  const detail::RankFileReader& file(size_t f) {
    if (!files_[f]) {
      files_[f] = std::make_unique<detail::RankFileReader>((fs::path(dir_) / manifest_.files[f].name).string());
    }
    return *files_[f];
  }

  std::string dir_;
  const CheckpointManifest& manifest_;
  std::map<std::string, std::vector<std::pair<size_t, const CheckpointManifest::Piece*>>> pieces_of_;  // by tensor: (file, piece)
  std::string listed_name_;      // the tensor listed_ describes
  std::vector<Saved> listed_;
  std::vector<std::unique_ptr<detail::RankFileReader>> files_;
};

// Collective: rank r checks files r, r + world, ...; every rank learns each
// problem found (as text) and throws the same error naming them.
void verify_files(const std::string& dir, const CheckpointManifest& manifest, const CommPtr& comm) {
  const int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
  // This rank's files, with the tensor table their headers are checked against.
  CheckpointManifest mine_only = manifest;
  mine_only.files.clear();
  for (size_t f = static_cast<size_t>(rank); f < manifest.files.size(); f += static_cast<size_t>(world)) {
    mine_only.files.push_back(manifest.files[f]);
  }
  const std::vector<std::string> found = verify_checkpoint_files(dir, mine_only);
  // The first few of each rank: a manifest of another model can disagree with every entry.
  constexpr size_t kShown = 4;
  std::string mine;
  for (size_t i = 0; i < std::min(found.size(), kShown); ++i) mine += (i ? "; " : "") + found[i];
  if (found.size() > kShown) mine += "; and " + std::to_string(found.size() - kShown) + " more";
  std::string message;
  for (const auto& problems : detail::all_gather_strings(comm, mine)) {
    if (!problems.empty()) message += (message.empty() ? "" : "; ") + problems;
  }
  if (!message.empty()) {
    throw CheckpointDamagedError("load_checkpoint: " + dir + " is damaged, nothing was loaded: " + message);
  }
}

CheckpointManifest read_manifest_everywhere(const std::string& dir, const CommPtr& comm) {
  CheckpointManifest manifest;
  std::string error;
  try {
    manifest = read_checkpoint_manifest(dir);
  } catch (const std::exception& e) {
    error = std::string("load_checkpoint: ") + e.what();
  }
  detail::agree_or_throw(comm, error);
  return manifest;
}

CheckpointManifest load_held(const std::string& dir, const detail::HeldModel& held, torch::optim::Optimizer* optimizer,
                             const CommPtr& comm) {
  torch::NoGradGuard no_grad;
  const CheckpointManifest manifest = read_manifest_everywhere(dir, comm);
  verify_files(dir, manifest, comm);

  const std::string kind = detail::optimizer_kind(optimizer);
  std::vector<torch::Tensor> staged(held.tensors.size());
  std::vector<std::map<std::string, torch::Tensor>> optimizer_values(held.tensors.size());
  std::string error;
  try {
    // Names and shapes first: a clear error instead of a partial load.
    std::map<std::string, bool> model_names;
    std::string problems;
    for (const auto& tensor : held.tensors) {
      model_names[tensor.name] = true;
      auto it = manifest.tensors.find(tensor.name);
      if (it == manifest.tensors.end()) {
        problems += "; the checkpoint lacks '" + tensor.name + "'";
      } else if (it->second.shape != tensor.shape) {
        problems += "; '" + tensor.name + "' is " + c10::str(c10::IntArrayRef(it->second.shape)) +
                    " in the checkpoint but " + c10::str(c10::IntArrayRef(tensor.shape)) + " in the model";
      } else if (it->second.dtype != dtype_name(tensor.flat.scalar_type())) {
        problems += "; '" + tensor.name + "' is " + it->second.dtype + " in the checkpoint but " +
                    dtype_name(tensor.flat.scalar_type()) + " in the model";
      }
    }
    for (const auto& [name, tensor] : manifest.tensors) {
      if (name.rfind("optim/", 0) != 0 && !model_names.count(name)) problems += "; the model lacks '" + name + "'";
    }
    if (optimizer && manifest.optimizer != kind) {
      problems += "; the checkpoint holds " + manifest.optimizer + " optimizer state but the optimizer is " + kind +
                  (manifest.optimizer == "none" ? " (pass nullptr to load the model alone)" : "");
    }
    // Optimizer state is complete for its optimizer, or absent: a parameter
    // with some fields but not all would fail half-way through the writes.
    if (optimizer) {
      const auto keys = detail::optimizer_state_keys(kind);
      for (const auto& tensor : held.tensors) {
        if (!tensor.parameter.defined()) continue;
        std::vector<std::string> present, missing;
        for (const auto& key : keys) {
          if (manifest.tensors.count(detail::optimizer_state_name(tensor.name, key))) {
            present.push_back(key);
          } else if (key != "max_exp_avg_sq") {  // AdamW without amsgrad keeps none
            missing.push_back(key);
          }
        }
        if (!present.empty() && !missing.empty()) {
          std::string fields;
          for (const auto& key : missing) fields += (fields.empty() ? "" : ", ") + key;
          problems += "; the " + kind + " state of '" + tensor.name + "' lacks " + fields;
        }
      }
    }
    if (!problems.empty()) throw std::runtime_error(dir + " does not match the model" + problems);

    CheckpointReader reader(dir, manifest);
    for (size_t i = 0; i < held.tensors.size(); ++i) {
      const auto& tensor = held.tensors[i];
      const auto runs = detail::global_runs(tensor);
      staged[i] = reader.read(tensor.name, runs, tensor.flat.scalar_type());
      if (!optimizer || !tensor.parameter.defined()) continue;
      for (const auto& key : detail::optimizer_state_keys(kind)) {
        const auto name = detail::optimizer_state_name(tensor.name, key);
        if (!manifest.tensors.count(name)) continue;
        optimizer_values[i][key] = key == "step" ? reader.read(name, 0, 1, torch::kInt64)
                                                 : reader.read(name, runs, tensor.flat.scalar_type());
      }
    }
  } catch (const std::exception& e) {
    error = std::string("load_checkpoint: ") + e.what();
  }
  detail::agree_or_throw(comm, error);

  for (size_t i = 0; i < held.tensors.size(); ++i) {
    held.tensors[i].flat.copy_(staged[i]);
    if (!optimizer || !held.tensors[i].parameter.defined()) continue;
    if (optimizer_values[i].empty()) {
      optimizer->state().erase(held.tensors[i].parameter.unsafeGetTensorImpl());
    } else {
      // Read on the host; the state lives where its parameter does (a GPU).
      const auto device = held.tensors[i].parameter.device();
      for (auto& [key, value] : optimizer_values[i])
        if (key != "step") value = value.to(device);
      detail::set_optimizer_state(*optimizer, held.tensors[i].parameter, optimizer_values[i]);
    }
  }
  return manifest;
}

}  // namespace

CheckpointManifest load_checkpoint(const std::string& dir, torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                                   const CommPtr& comm) {
  return load_held(dir, detail::held_by_module(model, comm), optimizer, comm);
}

CheckpointManifest load_checkpoint(const std::string& dir, const HeldModel& held, torch::optim::Optimizer* optimizer,
                                   const CommPtr& comm) {
  return load_held(dir, held, optimizer, comm);
}

CheckpointManifest load_checkpoint(const std::string& dir, FullyShardedBase& fsdp, torch::optim::Optimizer* optimizer) {
  return load_held(dir, detail::held_by_fsdp(fsdp), optimizer, fsdp.comm());
}

namespace {

torch::ScalarType dtype_by_name(const std::string& dir, const std::string& tensor, const std::string& dtype) {
  for (auto candidate : {torch::kFloat32, torch::kFloat64, torch::kBFloat16, torch::kFloat16, torch::kInt64,
                         torch::kInt32, torch::kInt16, torch::kInt8, torch::kUInt8, torch::kBool}) {
    if (dtype_name(candidate) == dtype) return candidate;
  }
  throw std::runtime_error(dir + ": '" + tensor + "' has unsupported dtype " + dtype);
}

}  // namespace

std::map<std::string, torch::Tensor> load_full_checkpoint(const std::string& dir, bool optimizer_state) {
  const CheckpointManifest manifest = read_checkpoint_manifest(dir);
  verify_files(dir, manifest, nullptr);
  CheckpointReader reader(dir, manifest);
  std::map<std::string, torch::Tensor> result;
  for (const auto& [name, tensor] : manifest.tensors) {
    if (!optimizer_state && name.rfind("optim/", 0) == 0) continue;
    const auto dtype = dtype_by_name(dir, name, tensor.dtype);
    result[name] = reader.read(name, 0, numel_of(tensor.shape), dtype).view(tensor.shape);
  }
  return result;
}

void read_checkpoint_tensors(const std::string& dir, const CheckpointTensorsVisitor& use) {
  const CheckpointManifest manifest = read_checkpoint_manifest(dir);
  verify_files(dir, manifest, nullptr);
  CheckpointReader reader(dir, manifest);
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, tensor] : manifest.tensors) {
    if (name.rfind("optim/", 0) == 0) continue;
    entries.push_back({name, dtype_by_name(dir, name, tensor.dtype), tensor.shape});
  }
  use(entries, [&](size_t i) {
    return reader.read(entries[i].name, 0, numel_of(entries[i].shape), entries[i].dtype).view(entries[i].shape);
  });
}

size_t export_checkpoint_safetensors(const std::string& dir, const std::string& path,
                                     const std::map<std::string, std::string>& metadata) {
  size_t written = 0;
  read_checkpoint_tensors(dir, [&](const std::vector<SafetensorsEntry>& entries, const std::function<torch::Tensor(size_t)>& tensor_at) {
    save_safetensors_streamed(path, entries, tensor_at, metadata);
    written = entries.size();
  });
  return written;
}

}  // namespace dtrain
