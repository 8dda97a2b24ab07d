// Hugging Face model directories (include/dtrain/hugging_face.h): loading
// them into what a rank holds, and exporting a checkpoint to one, with the
// names and layouts a model's hf::Layout gives.
#include "checkpoint/held_state.h"
#include "checkpoint/rank_file_reader.h"
#include "checkpoint/state_fit.h"

#include <dtrain/hugging_face.h>

#include <nlohmann/json.hpp>

#include <c10/util/accumulate.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>

namespace dtrain::hf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text(const fs::path& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error(path.string() + ": cannot be read");
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// The directory's safetensors files and which holds each tensor.
class ModelFiles {
 public:
  // A tensor of the directory: its file and its name, shape and dtype there.
  struct Entry {
    std::string file;
    detail::TensorSignature signature;
  };

  explicit ModelFiles(const std::string& dir) : dir_(dir) {
    const fs::path index = fs::path(dir) / "model.safetensors.index.json";
    if (fs::exists(index)) {
      const json parsed = json::parse(read_text(index), nullptr, false);
      if (!parsed.is_object() || !parsed.contains("weight_map") || !parsed["weight_map"].is_object())
        throw std::runtime_error(index.string() + ": has no \"weight_map\" object");
      std::map<std::string, std::string> listed;  // the index's name -> file
      std::set<std::string> files;
      for (const auto& [name, file] : parsed["weight_map"].items()) {
        if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
          throw std::runtime_error(index.string() + ": the file of '" + name + "' is not a file name in " + dir);
        listed[name] = file.get<std::string>();
        files.insert(file.get<std::string>());
      }
      // Every shard's header is read and checked; a tensor counts in the file the index names.
      for (const auto& file : files) {
        for (const auto& tensor : reader(file).header().tensors)
          if (const auto it = listed.find(tensor.name); it != listed.end() && it->second == file) add(file, tensor);
      }
      for (const auto& [name, file] : listed)
        if (!entries_.count(name)) throw std::runtime_error(index.string() + ": '" + name + "' is not in " + file + " as the index says");
    } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
      for (const auto& tensor : reader("model.safetensors").header().tensors) add("model.safetensors", tensor);
    } else {
      throw std::runtime_error(dir + " has neither model.safetensors nor model.safetensors.index.json (a Hugging Face "
                               "model directory saved with save_pretrained(..., safe_serialization=True))");
    }
  }

  // By Hugging Face name.
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const detail::RankFileReader& reader_of(const Entry& entry) { return reader(entry.file); }

 private:
  void add(const std::string& file, const safetensors::TensorEntry& tensor) {
    entries_[tensor.name] = {file, {tensor.name, tensor.shape, detail::torch_dtype_of(tensor.dtype)}};
  }
  const detail::RankFileReader& reader(const std::string& file) {
    auto& slot = readers_[file];
    if (!slot) slot = std::make_unique<detail::RankFileReader>((fs::path(dir_) / file).string());
    return *slot;
  }
  std::string dir_;
  std::map<std::string, std::unique_ptr<detail::RankFileReader>> readers_;
  std::map<std::string, Entry> entries_;
};

// What the model expects of the directory: each tensor under its Hugging
// Face name, in Hugging Face's layout.
struct Expected {
  std::string hf;
  bool transposed = false;
  std::vector<int64_t> hf_shape;
};

Expected expected_of(const Layout& layout, const std::string& name, const std::vector<int64_t>& shape,
                     bool prefixed) {
  Expected e;
  e.hf = layout.name(name, &e.transposed);
  if (!prefixed && e.hf.rfind(layout.optional_prefix, 0) == 0) e.hf = e.hf.substr(layout.optional_prefix.size());
  e.hf_shape = shape;
  if (e.transposed) std::swap(e.hf_shape[0], e.hf_shape[1]);
  return e;
}

// Checks the directory against the model's tensors (name, shape, dtype),
// all before anything is read; returns each tensor's expectation.
std::vector<Expected> check_directory(ModelFiles& files, const Layout& layout, const std::string& dir,
                                      const std::vector<detail::TensorSignature>& tensors) {
  if (!layout.name) throw std::invalid_argument("a Hugging Face layout without a name mapping (hf::Layout::name)");
  // Files name every tensor with the optional prefix, or none (GPT-2's GPT2LMHeadModel and GPT2Model).
  bool prefixed = layout.optional_prefix.empty();
  for (const auto& [name, entry] : files.entries()) prefixed = prefixed || name.rfind(layout.optional_prefix, 0) == 0;
  std::vector<Expected> expected;
  std::set<std::string> expected_names;
  std::vector<detail::TensorSignature> model_side, file_side;
  for (const auto& tensor : tensors) {
    expected.push_back(expected_of(layout, tensor.name, tensor.shape, prefixed));
    expected_names.insert(expected.back().hf);
    model_side.push_back({expected.back().hf, expected.back().hf_shape, tensor.dtype});
  }
  // A tensor the model has is always read, even one the layout may skip (an untied head).
  for (const auto& [name, entry] : files.entries())
    if (expected_names.count(name) || !layout.skipped || !layout.skipped(name)) file_side.push_back(entry.signature);
  detail::check_state_fits(dir, model_side, file_side);
  return expected;
}

// The whole tensor `e.hf` in dtrain's layout, in the file's dtype.
torch::Tensor read_whole(ModelFiles& files, const Expected& e) {
  const ModelFiles::Entry& entry = files.entries().at(e.hf);
  auto whole = torch::empty(e.hf_shape, torch::TensorOptions().dtype(entry.signature.dtype));
  files.reader_of(entry).read(e.hf, 0, whole.view(-1));
  return e.transposed ? whole.t().contiguous() : whole;
}

// Writes `text` to `path` through a temporary file renamed over it: a reader
// sees the old file or the whole new one.
void save_text_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file << text;
    file.flush();
    if (!file) {
      std::error_code ignored;
      fs::remove(temporary, ignored);
      throw std::runtime_error(path + ": cannot be written");
    }
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) throw std::runtime_error(path + ": cannot be written (" + error.message() + ")");
}

std::vector<detail::TensorSignature> signatures_of(const HeldModel& held) {
  std::vector<detail::TensorSignature> tensors;
  for (const auto& tensor : held.tensors) tensors.push_back({tensor.name, tensor.shape, tensor.flat.scalar_type()});
  return tensors;
}

}  // namespace

void load_into(const HeldModel& held, const Layout& layout, const std::string& dir) {
  torch::NoGradGuard no_grad;
  ModelFiles files(dir);
  const std::vector<Expected> expected = check_directory(files, layout, dir, signatures_of(held));
  for (size_t i = 0; i < held.tensors.size(); ++i) {
    const HeldTensor& tensor = held.tensors[i];
    if (tensor.flat.numel() == 0) continue;
    // One whole tensor at a time (a transposed one cannot be read piecewise):
    // this rank's pieces are copied out of it.
    const auto whole = read_whole(files, expected[i]).view(-1).to(tensor.flat.scalar_type());
    for_each_range(detail::global_runs(tensor), [&](int64_t begin, int64_t end, int64_t position) {
      tensor.flat.narrow(0, position, end - begin).copy_(whole.narrow(0, begin, end - begin));
    });
  }
}

void check_fits(const torch::nn::Module& module, const Layout& layout, const std::string& dir) {
  ModelFiles files(dir);
  std::vector<detail::TensorSignature> tensors;
  for (const auto& item : module.named_parameters(true))
    tensors.push_back({item.key(), item.value().sizes().vec(), item.value().scalar_type()});
  check_directory(files, layout, dir, tensors);
}

int export_checkpoint(const std::string& checkpoint_dir, const std::string& out_dir, const Layout& layout,
                      const std::string& config_json, int64_t max_shard_bytes) {
  if (max_shard_bytes < 1) throw std::invalid_argument("the largest shard must be at least 1 byte");
  if (!layout.name) throw std::invalid_argument("a Hugging Face layout without a name mapping (hf::Layout::name)");
  std::error_code error;
  fs::create_directories(out_dir, error);
  if (error) throw std::runtime_error(out_dir + ": cannot be created (" + error.message() + ")");
  int files_written = 0;
  read_checkpoint_tensors(checkpoint_dir, [&](const std::vector<SafetensorsEntry>& entries,
                                              const std::function<torch::Tensor(size_t)>& tensor_at) {
    // Hugging Face's names and layouts, in the checkpoint's order, split
    // into shards of at most max_shard_bytes (a larger tensor alone).
    std::vector<SafetensorsEntry> renamed;
    std::vector<bool> transposed;
    for (const auto& entry : entries) {
      bool t = false;
      renamed.push_back({layout.name(entry.name, &t), entry.dtype, entry.shape});
      if (t) std::swap(renamed.back().shape[0], renamed.back().shape[1]);
      transposed.push_back(t);
    }
    std::vector<std::vector<size_t>> shards(1);
    int64_t bytes = 0, total = 0;
    for (size_t i = 0; i < renamed.size(); ++i) {
      const int64_t size = static_cast<int64_t>(c10::elementSize(renamed[i].dtype)) * c10::multiply_integers(renamed[i].shape);
      total += size;
      if (!shards.back().empty() && bytes + size > max_shard_bytes) {
        shards.emplace_back();
        bytes = 0;
      }
      shards.back().push_back(i);
      bytes += size;
    }
    const auto produce = [&](size_t i) {
      auto tensor = tensor_at(i);
      return transposed[i] ? tensor.t().contiguous() : tensor;
    };
    const std::map<std::string, std::string> metadata{{"format", "pt"}};
    if (shards.size() == 1) {
      save_safetensors_streamed((fs::path(out_dir) / "model.safetensors").string(), renamed, produce, metadata);
      files_written = 1;
      fs::remove(fs::path(out_dir) / "model.safetensors.index.json", error);
      return;
    }
    json weight_map = json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      char file[64];
      std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      std::vector<SafetensorsEntry> part;
      for (size_t i : shards[s]) {
        part.push_back(renamed[i]);
        weight_map[renamed[i].name] = file;
      }
      save_safetensors_streamed((fs::path(out_dir) / file).string(), part,
                                [&](size_t k) { return produce(shards[s][k]); }, metadata);
    }
    const json index{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    save_text_atomically((fs::path(out_dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
    fs::remove(fs::path(out_dir) / "model.safetensors", error);
    files_written = static_cast<int>(shards.size()) + 1;
  });
  save_text_atomically((fs::path(out_dir) / "config.json").string(), config_json);
  return files_written;
}

}  // namespace dtrain::hf
