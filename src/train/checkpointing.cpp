#include "train/checkpointing.h"

#include "checkpoint/fault_injection.h"
#include "checkpoint/rank_agreement.h"
#include "common/file_tree.h"
#include "dtrain/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/types.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace dtrain::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPrefix = "step-";

// The step a directory name stands for: "step-00000100" -> 100; unfinished
// saves ("step-00000100.tmp-100") and anything else -> nullopt.
std::optional<int64_t> step_of(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
  const std::string digits = name.substr(std::char_traits<char>::length(kPrefix));
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  // A name like step-99999999999999999999 is not a checkpoint of ours
  // (more steps than an int64 holds): skipped, not a crash.
  int64_t step = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return step;
}

// Every checkpoint directory in `dir` by step, newest last.
std::map<int64_t, fs::path> checkpoints_in(const std::string& dir) {
  std::map<int64_t, fs::path> found;
  std::error_code error;
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    if (!it->is_directory(error)) continue;
    if (auto step = step_of(it->path().filename().string())) found[*step] = it->path();
  }
  return found;
}

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "%s%08lld", kPrefix, static_cast<long long>(step));
  return (fs::path(dir) / name).string();
}

std::vector<int64_t> resumable_checkpoints(const std::string& dir, std::vector<std::string>& rejected) {
  std::vector<int64_t> steps;
  const auto found = checkpoints_in(dir);
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    const std::string name = it->second.filename().string();
    try {
      const CheckpointManifest manifest = read_checkpoint_manifest(it->second.string());
      const auto mismatches = verify_checkpoint_files(it->second.string(), manifest, /*checksums=*/false);
      if (mismatches.empty()) {
        steps.push_back(it->first);
      } else {
        rejected.push_back(name + ": " + mismatches.front());
      }
    } catch (const std::exception& error) {
      rejected.push_back(name + ": " + error.what());
    }
  }
  return steps;
}

void prune_checkpoints(const std::string& dir, int64_t keep_last) {
  const auto found = checkpoints_in(dir);
  if (found.empty()) return;
  const int64_t newest = found.rbegin()->first;
  std::error_code error;
  if (keep_last > 0) {
    int64_t kept = 0;
    for (auto it = found.rbegin(); it != found.rend(); ++it) {
      if (kept < keep_last) {
        ++kept;
        continue;
      }
      // Renamed out of the way first (one atomic step), then removed: a crash
      // half-way through leaves a .tmp- folder --resume ignores, never a
      // checkpoint with some of its files gone.
      // (remove_tree, not std::filesystem::remove_all: Note [filesystem symbols from LibTorch].)
      const fs::path doomed = it->second.string() + ".tmp-prune";
      detail::remove_tree(doomed.string());
      fs::rename(it->second, doomed, error);
      detail::crash_point("while pruning, after renaming an old checkpoint aside");
      detail::remove_tree((error ? it->second : doomed).string());
      detail::crash_point("while pruning, after removing an old checkpoint");
    }
  }
  // Unfinished saves of earlier steps: a run that was killed while saving.
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const auto dot = name.find(".tmp-");
    if (dot == std::string::npos) continue;
    if (auto step = step_of(name.substr(0, dot)); step && *step < newest) detail::remove_tree(it->path().string());
  }
}

namespace {

std::string rng_key(int rank) {
  char key[32];
  std::snprintf(key, sizeof(key), "rng/rank-%05d", rank);
  return key;
}

}  // namespace

std::map<std::string, std::string> with_random_states(std::map<std::string, std::string> extra, const CommPtr& world) {
  const auto states = detail::all_gather_strings(world, cpu_rng_state());
  for (size_t rank = 0; rank < states.size(); ++rank) extra[rng_key(static_cast<int>(rank))] = states[rank];
  return extra;
}

void save_training_checkpoint(const std::string& dir, int64_t step, int64_t keep_last, const SaveCheckpoint& save,
                              const CommPtr& world, std::map<std::string, std::string> extra) {
  save(checkpoint_path(dir, step), step, with_random_states(std::move(extra), world));
  if (world->rank() == 0) prune_checkpoints(dir, keep_last);
}

std::optional<CheckpointManifest> resume_from_latest(const std::string& dir, const LoadCheckpoint& load,
                                                     const CommPtr& world, std::vector<std::string>* rejected) {
  // Rank 0 lists the candidates, newest first, and tells the others.
  std::vector<int64_t> candidates;
  std::vector<std::string> passed_over;
  if (world->rank() == 0) candidates = resumable_checkpoints(dir, passed_over);
  auto counts = torch::tensor({static_cast<int64_t>(candidates.size()), static_cast<int64_t>(passed_over.size())});
  world->blocking().broadcast(counts, 0);
  auto steps = world->rank() == 0 ? torch::tensor(candidates, torch::kInt64)
                                  : torch::zeros({counts[0].item<int64_t>()}, torch::kInt64);
  if (steps.numel() > 0) world->blocking().broadcast(steps, 0);

  std::optional<CheckpointManifest> loaded;
  for (int64_t i = 0; i < steps.numel() && !loaded; ++i) {
    const std::string path = checkpoint_path(dir, steps[i].item<int64_t>());
    try {
      loaded = load(path);
    } catch (const CheckpointDamagedError& damaged) {
      // Every rank gets the same error (the ranks agree on the verification)
      // before anything was loaded: try the next older one.
      if (world->rank() == 0) passed_over.push_back(fs::path(path).filename().string() + ": " + damaged.what());
    }
  }
  if (!loaded && (steps.numel() > 0 || counts[1].item<int64_t>() > 0)) {
    // Starting afresh would quietly drop the run's progress (and pruning would
    // later delete the evidence): the user decides.
    std::string why;
    for (const auto& reason : passed_over) why += "\n  " + reason;
    throw std::runtime_error("--resume: no checkpoint in " + dir + " can be loaded; every one is incomplete or damaged" +
                             (why.empty() ? std::string(" (rank 0 lists why)") : ":" + why) +
                             "\nMove them away (or pick another --checkpoint-dir) to start at step 0.");
  }
  if (rejected) *rejected = passed_over;
  if (!loaded) return std::nullopt;
  const CheckpointManifest& manifest = *loaded;
  if (manifest.world_size == world->size()) {
    if (auto state = manifest.extra.find(rng_key(world->rank())); state != manifest.extra.end())
      set_cpu_rng_state(state->second);
  }
  return loaded;
}

std::string cpu_rng_state() {
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  torch::Tensor state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  const auto* bytes = state.data_ptr<uint8_t>();
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(static_cast<size_t>(state.numel()) * 2);
  for (int64_t i = 0; i < state.numel(); ++i) {
    hex += digits[bytes[i] >> 4];
    hex += digits[bytes[i] & 15];
  }
  return hex;
}

void set_cpu_rng_state(const std::string& hex) {
  if (hex.size() % 2 != 0) throw std::runtime_error("the checkpoint's random state is malformed (odd length)");
  torch::Tensor state = torch::empty({static_cast<int64_t>(hex.size() / 2)}, torch::kUInt8);
  auto* bytes = state.data_ptr<uint8_t>();
  auto value = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw std::runtime_error("the checkpoint's random state is malformed (not hex)");
  };
  for (size_t i = 0; i < hex.size() / 2; ++i) bytes[i] = static_cast<uint8_t>(value(hex[2 * i]) * 16 + value(hex[2 * i + 1]));
  at::Generator generator = at::detail::getDefaultCPUGenerator();  // a handle to the process-wide one
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace dtrain::train
