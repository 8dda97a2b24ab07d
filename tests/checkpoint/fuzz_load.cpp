// libFuzzer target for the whole checkpoint load path (`make fuzz-load`; see
// the Makefile), not only its parsers: an input is a checkpoint directory
// (manifest.json and rank files), written to disk and loaded into a live
// model and AdamW optimizer with load_checkpoint, then read whole with
// load_full_checkpoint. The promises checked on every input:
//   - the load either succeeds or throws a std::exception (no crash, no
//     sanitizer report, no other exception type);
//   - a load that throws leaves the model's parameters and the optimizer's
//     state bitwise as they were (issue 16: all-or-nothing loads).
//
// Input format (tests/checkpoint/fuzz_corpus_load/ holds real checkpoints in
// it): one flags byte, then records of a 4-byte little-endian length and that
// many bytes. Record 0 is manifest.json; record i >= 1 is the file
// rank_file_name(i - 1, number of rank files). Flags: bit 0 set = before
// loading, rewrite each file's "bytes" and "xxh64" in the manifest to the
// actual files' (when the manifest is JSON), so that mutations get past the
// checksums and reach the checks behind them; bit 1 set = load the model
// alone (no optimizer).
//
// With DTRAIN_FUZZ_WRITE_SEEDS=DIR set, LLVMFuzzerInitialize writes the seed
// inputs into DIR and exits: a real one-rank and a two-rank checkpoint of the
// model, and the crafted bad checkpoints of issue 16 (overlapping, missing
// and duplicate pieces, a wrong dtype, missing exp_avg, an absurd shape with
// no pieces, a truncated rank file, a tensor the model lacks and the reverse).
//
// The same file, built without libFuzzer into fuzz_load_replay
// (replay_fuzz_load_corpus.cpp), replays the committed corpus in `make test`:
// seeds named good-* must load, bad-* must be refused.
#include "checkpoint/held_state.h"
#include "checkpoint/manifest.h"

#include <dtrain/checkpoint.h>

#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <xxhash.h>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint8_t kFixChecksums = 1, kModelOnly = 2;

void check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "fuzz_load: broken promise: %s\n", what);
    std::abort();
  }
}

struct Live {
  torch::nn::Sequential model{torch::nn::Linear(3, 2), torch::nn::ReLU(), torch::nn::Linear(2, 2)};
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::vector<torch::Tensor> parameters;                           // pristine copies
  std::vector<std::map<std::string, torch::Tensor>> state;         // pristine copies
  std::string dir, pristine_dir, export_path;

  Live() {
    torch::manual_seed(7);
    optimizer = std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(0.1));
    model->forward(torch::randn({4, 3})).sum().backward();
    optimizer->step();
    for (const auto& p : model->parameters()) parameters.push_back(p.detach().clone());
    state = optimizer_state();
    const fs::path base = fs::temp_directory_path() / ("dtrain-fuzz-load-" + std::to_string(::getpid()));
    fs::create_directories(base);
    dir = (base / "input").string();
    pristine_dir = (base / "pristine").string();
    export_path = (base / "export.safetensors").string();
    dtrain::save_checkpoint(pristine_dir, *model, optimizer.get(), 1, nullptr);
  }

  std::vector<std::map<std::string, torch::Tensor>> optimizer_state() {
    std::vector<std::map<std::string, torch::Tensor>> out;
    for (const auto& p : model->parameters()) {
      auto& fields = out.emplace_back();
      for (const auto& [key, value] : dtrain::detail::optimizer_state_of(*optimizer, p)) fields[key] = value.clone();
    }
    return out;
  }

  bool unchanged() {
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!torch::equal(params[i].detach(), parameters[i])) return false;
    }
    const auto now = optimizer_state();
    for (size_t i = 0; i < now.size(); ++i) {
      if (now[i].size() != state[i].size()) return false;
      for (const auto& [key, value] : now[i]) {
        auto it = state[i].find(key);
        if (it == state[i].end() || !torch::equal(value, it->second)) return false;
      }
    }
    return true;
  }
};

Live* live = nullptr;
std::string last_error;  // of the last input's load_checkpoint; empty when it loaded

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// One flags byte, then (length, bytes) records: the manifest, the rank files.
std::string pack(uint8_t flags, const std::vector<std::string>& records) {
  std::string out(1, static_cast<char>(flags));
  for (const auto& record : records) {
    const auto n = static_cast<uint32_t>(record.size());
    for (int b = 0; b < 4; ++b) out.push_back(static_cast<char>((n >> (8 * b)) & 0xff));
    out += record;
  }
  return out;
}

std::vector<std::string> unpack(const uint8_t* data, size_t size) {
  std::vector<std::string> records;
  size_t at = 1;
  while (at + 4 <= size && records.size() < 9) {
    uint32_t n = 0;
    for (int b = 0; b < 4; ++b) n |= static_cast<uint32_t>(data[at + b]) << (8 * b);
    at += 4;
    n = static_cast<uint32_t>(std::min<size_t>(n, size - at));
    records.emplace_back(reinterpret_cast<const char*>(data + at), n);
    at += n;
  }
  return records;
}

// Sizes and checksums of the files as they are, when the manifest is JSON.
std::string with_true_checksums(const std::string& manifest, const std::vector<std::string>& files) {
  json j = json::parse(manifest, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("files") || !j["files"].is_array()) return manifest;
  for (size_t i = 0; i < j["files"].size() && i < files.size(); ++i) {
    if (!j["files"][i].is_object()) continue;
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx",
                  static_cast<unsigned long long>(XXH64(files[i].data(), files[i].size(), 0)));
    j["files"][i]["bytes"] = files[i].size();
    j["files"][i]["xxh64"] = hex;
  }
  return j.dump(1);
}

void restore_pristine() {
  dtrain::load_checkpoint(live->pristine_dir, *live->model, live->optimizer.get(), nullptr);
  check(live->unchanged(), "reloading the pristine checkpoint restores the live state");
}

// ------------------------------------------------------------------ seeds

std::vector<std::string> checkpoint_records(const std::string& dir) {
  const auto manifest = dtrain::read_checkpoint_manifest(dir);
  std::vector<std::string> records{read_file(fs::path(dir) / "manifest.json")};
  for (const auto& file : manifest.files) records.push_back(read_file(fs::path(dir) / file.name));
  return records;
}

// The one-rank checkpoint split into two rank files: each tensor's first half
// in rank 0's file, the rest in rank 1's (a load then reads across files).
std::vector<std::string> two_rank_records(const std::string& dir, const std::string& scratch) {
  auto manifest = dtrain::read_checkpoint_manifest(dir);
  const auto whole = dtrain::load_safetensors((fs::path(dir) / manifest.files[0].name).string());
  std::vector<std::pair<std::string, torch::Tensor>> halves[2];
  dtrain::CheckpointManifest::File files[2];
  for (const auto& [name, tensor] : whole.tensors) {
    const int64_t n = tensor.numel(), cut = n / 2;
    const auto flat = tensor.reshape({-1});
    halves[0].emplace_back(name, flat.narrow(0, 0, cut).clone());
    halves[1].emplace_back(name, flat.narrow(0, cut, n - cut).clone());
    files[0].pieces.push_back({name, 0, cut});
    files[1].pieces.push_back({name, cut, n});
  }
  std::vector<std::string> records{""};
  manifest.files.clear();
  manifest.world_size = 2;
  manifest.strategy = "full";
  for (int r = 0; r < 2; ++r) {
    files[r].name = dtrain::detail::rank_file_name(r, 2);
    const std::string path = (fs::path(scratch) / files[r].name).string();
    dtrain::save_safetensors(path, halves[r]);
    records.push_back(read_file(path));
    files[r].bytes = static_cast<int64_t>(records.back().size());
    files[r].xxh64 = XXH64(records.back().data(), records.back().size(), 0);
    manifest.files.push_back(files[r]);
  }
  records[0] = dtrain::detail::manifest_to_json(manifest);
  return records;
}

void write_seeds(const std::string& out) {
  fs::create_directories(out);
  const std::string scratch = live->dir + "-seeds";
  fs::create_directories(scratch);
  const auto good = checkpoint_records(live->pristine_dir);
  const std::string model_only_dir = scratch + "/model-only";
  dtrain::save_checkpoint(model_only_dir, *live->model, nullptr, 1, nullptr);
  const auto two = two_rank_records(live->pristine_dir, scratch);

  std::map<std::string, std::string> seeds;
  seeds["good-one-rank"] = pack(0, good);
  seeds["good-one-rank-fixed"] = pack(kFixChecksums, good);
  seeds["good-model-only"] = pack(kModelOnly, checkpoint_records(model_only_dir));
  seeds["good-two-ranks"] = pack(0, two);
  // Crafted: the manifest edited (checksums fixed up by the flag).
  auto edited = [&](const std::string& name, const std::vector<std::string>& base, auto edit) {
    json j = json::parse(base[0]);
    edit(j);
    auto records = base;
    records[0] = j.dump(1);
    seeds[name] = pack(kFixChecksums, records);
  };
  auto first_piece = [](json& j, const std::string& tensor) -> json& {
    for (auto& file : j["files"])
      for (auto& piece : file["pieces"])
        if (piece[0] == tensor) return piece;
    throw std::runtime_error("no piece of " + tensor);
  };
  edited("bad-overlap", two, [&](json& j) { first_piece(j, "0.weight")[2] = 4; });
  edited("bad-gap", two, [&](json& j) { first_piece(j, "0.weight")[2] = 2; });
  edited("bad-duplicate-piece", two, [&](json& j) { j["files"][1]["pieces"].push_back(first_piece(j, "0.bias")); });
  edited("bad-wrong-dtype", good, [](json& j) { j["tensors"]["0.weight"]["dtype"] = "float64"; });
  edited("bad-missing-exp-avg", good, [](json& j) {
    j["tensors"].erase("optim/2.weight/exp_avg");
    auto& pieces = j["files"][0]["pieces"];
    for (size_t i = 0; i < pieces.size(); ++i)
      if (pieces[i][0] == "optim/2.weight/exp_avg") pieces.erase(i--);
  });
  edited("bad-absurd-shape-no-pieces", good, [](json& j) {
    j["tensors"]["9.weight"] = {{"dtype", "float32"}, {"shape", {4294967296LL, 4294967296LL, 4294967296LL}}};
  });
  edited("bad-tensor-the-model-lacks", good, [](json& j) { j["tensors"]["9.weight"] = {{"dtype", "float32"}, {"shape", {0}}}; });
  edited("bad-tensor-the-checkpoint-lacks", good, [](json& j) {
    j["tensors"].erase("2.bias");
    auto& pieces = j["files"][0]["pieces"];
    for (size_t i = 0; i < pieces.size(); ++i)
      if (pieces[i][0] == "2.bias") pieces.erase(i--);
  });
  edited("bad-wrong-file-name", two, [](json& j) { j["files"][1]["name"] = "rank-00001-of-00003.safetensors"; });
  edited("bad-optimizer-state-unknown-key", good, [](json& j) {
    j["tensors"]["optim/0.weight/velocity"] = j["tensors"]["0.weight"];
  });
  {
    auto truncated = good;
    truncated[1].resize(truncated[1].size() - 9);
    seeds["bad-truncated-rank-file"] = pack(kFixChecksums, truncated);
  }
  {
    auto flipped = good;
    flipped[1][flipped[1].size() - 3] ^= 0x40;
    seeds["bad-flipped-byte"] = pack(0, flipped);
  }
  for (const auto& [name, bytes] : seeds) write_file(fs::path(out) / name, bytes);
  fs::remove_all(scratch);
  std::cout << "fuzz_load: wrote " << seeds.size() << " seeds to " << out << std::endl;
}

}  // namespace

// For the corpus replay: why the last input's load was refused ("" when it loaded).
extern "C" const char* dtrain_fuzz_load_last_error() { return last_error.c_str(); }

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  torch::set_num_threads(1);
  live = new Live();
  std::atexit([] { std::error_code ignored; fs::remove_all(fs::path(live->dir).parent_path(), ignored); });
  if (const char* out = std::getenv("DTRAIN_FUZZ_WRITE_SEEDS")) {
    write_seeds(out);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  auto records = unpack(data, size);
  if (records.empty()) return 0;
  fs::remove_all(live->dir);
  fs::create_directories(live->dir);
  const std::vector<std::string> files(records.begin() + 1, records.end());
  if (flags & kFixChecksums) records[0] = with_true_checksums(records[0], files);
  write_file(fs::path(live->dir) / "manifest.json", records[0]);
  for (size_t i = 0; i < files.size(); ++i) {
    write_file(fs::path(live->dir) / dtrain::detail::rank_file_name(static_cast<int>(i), static_cast<int>(files.size())),
               files[i]);
  }

  torch::optim::Optimizer* optimizer = (flags & kModelOnly) ? nullptr : live->optimizer.get();
  bool loaded = false;
  last_error.clear();
  try {
    dtrain::load_checkpoint(live->dir, *live->model, optimizer, nullptr);
    loaded = true;
  } catch (const std::exception& error) {
    last_error = error.what();
    if (last_error.empty()) last_error = "(an exception without a message)";
    check(live->unchanged(), "a load that throws leaves the parameters and the optimizer state as they were");
  }
  if (loaded) restore_pristine();
  try {
    // Every tensor, optimizer state included, whatever the model: the path
    // of `dtrain checkpoint export` and of --init-from a checkpoint.
    for (const auto& [name, tensor] : dtrain::load_full_checkpoint(live->dir, true)) {
      check(tensor.defined(), "load_full_checkpoint returns defined tensors");
    }
  } catch (const std::exception&) {
  }
  return 0;
}
