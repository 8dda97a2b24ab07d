// Sharded save: every rank writes its pieces into DIR.tmp-STEP, rank 0 adds
// the manifest last and renames the directory into place. See "sharded
// checkpoints" in include/dtrain/checkpoint.h.
#include "checkpoint/fault_injection.h"
#include "checkpoint/held_state.h"
#include "checkpoint/manifest.h"
#include "checkpoint/rank_agreement.h"
#include "checkpoint/save_protocol.h"
#include "common/file_tree.h"

#include <dtrain/checkpoint.h>
#include <dtrain/fsdp.h>

#include <torch/types.h>
#include <torch/utils.h>

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc 2.28)
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace dtrain {
namespace {

// Every rank writes its file into the directory rank 0 creates and renames
// into place, and a load reads other ranks' files: one filesystem for all.
constexpr const char* kSharedFilesystem =
    "the checkpoint directory must be on a filesystem every rank shares (NFS, Lustre, or one machine's disk); "
    "pass a --checkpoint-dir that every host mounts at the same path";

namespace fs = std::filesystem;

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open to flush: " + std::strerror(errno));
  const int result = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (result != 0) throw std::runtime_error(path + ": fsync failed: " + std::strerror(saved));
}

void write_whole_file(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error(path + ": cannot create: " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = detail::write_to_disk(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int saved = errno;
      ::close(fd);
      throw std::runtime_error(path + ": write failed: " + std::strerror(saved));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) throw std::runtime_error(path + ": cannot flush to disk");
}

// `piece` holds the elements `runs` lists, in order: one manifest piece per
// run, each starting where the one before it ends in the file's entry.
void add_piece(detail::RankFile& file, const std::string& name, const std::vector<int64_t>& shape,
               const std::vector<FlatRun>& runs, const torch::Tensor& piece) {
  file.tensor_table[name] = {dtype_name(piece.scalar_type()), shape};
  if (piece.numel() == 0) return;
  file.tensors.emplace_back(name, piece);
  int64_t offset = 0;
  for (const FlatRun& run : runs) {
    file.record.pieces.push_back({name, run.begin, run.begin + run.length, offset, run.stride, run.count});
    offset += run.numel();
  }
}

}  // namespace

namespace detail {

RankFile rank_file_of(const HeldModel& held, torch::optim::Optimizer* optimizer) {
  RankFile file;
  for (const auto& tensor : held.tensors) {
    const auto share = shard_range(tensor.flat.numel(), tensor.replicas, tensor.replica);
    const auto runs = sub_runs(detail::global_runs(tensor), share.offset, share.offset + share.count);
    add_piece(file, tensor.name, tensor.shape, runs, tensor.flat.narrow(0, share.offset, share.count));
    if (!optimizer || !tensor.parameter.defined()) continue;
    for (const auto& [key, value] : detail::optimizer_state_of(*optimizer, tensor.parameter)) {
      const auto name = detail::optimizer_state_name(tensor.name, key);
      if (key == "step") {
        // One copy: from the writer of the parameter's first element.
        int64_t numel = 1;
        for (int64_t d : tensor.shape) numel *= d;
        const bool first = share.count > 0 ? std::any_of(runs.begin(), runs.end(), [](const FlatRun& r) { return r.begin == 0; })
                                           : (numel == 0 && held.rank == 0);
        file.tensor_table[name] = {dtype_name(value.scalar_type()), {}};
        if (first) add_piece(file, name, {}, {{0, 1, 0, 1}}, value);
      } else {
        add_piece(file, name, tensor.shape, runs, value.narrow(0, share.offset, share.count));
      }
    }
  }
  return file;
}

}  // namespace detail

namespace {

using detail::RankFile;

// Not std::filesystem::remove_all: Note [filesystem symbols from LibTorch].
void remove_tree_or_throw(const fs::path& path) {
  std::string error;
  if (!detail::remove_tree(path.string(), &error)) throw std::runtime_error(error);
}

// Puts the finished `temporary` at `target`. Replacing an existing
// checkpoint swaps the two directories in one atomic rename (Linux's
// RENAME_EXCHANGE), so a crash at any moment leaves a complete checkpoint at
// `target`, old or new; the old one, now at `temporary`, is removed after
// (a crash before that leaves a .tmp folder --resume ignores and the next
// save of that step removes). Where the filesystem cannot exchange, the old
// one is renamed aside first, as before (a crash between the two renames
// leaves it at TARGET.old-PID).
void replace_directory(const fs::path& temporary, const fs::path& target) {
  if (fs::exists(target)) {
    if (::renameat2(AT_FDCWD, temporary.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
      fsync_path(target.parent_path().string());
      detail::crash_point("after swapping the new checkpoint in, before removing the old one");
      remove_tree_or_throw(temporary);
      return;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
      throw std::runtime_error("cannot swap " + temporary.string() + " with " + target.string() + ": " +
                               std::strerror(errno));
    }
    const fs::path aside = target.string() + ".old-" + std::to_string(::getpid());
    remove_tree_or_throw(aside);
    fs::rename(target, aside);
    fs::rename(temporary, target);
    fsync_path(target.parent_path().string());
    remove_tree_or_throw(aside);
    return;
  }
  fs::rename(temporary, target);
  fsync_path(target.parent_path().string());
  detail::crash_point("after moving the checkpoint into place");
}

}  // namespace

namespace detail {

void write_checkpoint(const SaveRequest& request, const RankFile& built, std::string earlier_error, const CommPtr& comm) {
  torch::NoGradGuard no_grad;  // per thread: the writer thread's own
  const std::string& dir = request.dir;
  const int64_t step = request.step;
  fs::path target = fs::absolute(fs::path(dir)).lexically_normal();
  if (!target.has_filename()) target = target.parent_path();  // "ckpt/" -> "ckpt"
  if (dir.empty() || target == target.root_path()) {
    throw std::invalid_argument("save_checkpoint: '" + dir + "' names no directory");
  }
  const fs::path temporary = target.string() + ".tmp-" + std::to_string(step);

  std::string error;
  if (request.rank == 0) {
    try {
      fs::create_directories(target.parent_path());
      remove_tree_or_throw(temporary);  // left over from an interrupted save
      fs::create_directory(temporary);
    } catch (const std::exception& e) {
      error = "save_checkpoint: cannot create " + temporary.string() + ": " + e.what();
    }
  }
  detail::agree_or_throw(comm, error);
  // From here a failure on any rank leaves no partial directory behind (a
  // full disk stays as full as it was): every rank has stopped writing once
  // the agreement throws, and rank 0 removes the temporary directory.
  auto agree_or_clean_up = [&](const std::string& own_error) {
    try {
      detail::agree_or_throw(comm, own_error);
    } catch (...) {
      if (request.rank == 0) detail::remove_tree(temporary.string());
      throw;
    }
  };

  RankFile file = built;
  try {
    // A failure building this rank's file counts here, where every rank
    // agrees on the files: the collectives stay the same on every rank.
    if (!earlier_error.empty()) throw std::runtime_error(earlier_error);
    if (!fs::is_directory(temporary)) {
      throw std::runtime_error(temporary.string() + ", which rank 0 created, is not there on rank " +
                               std::to_string(request.rank) + ": " + kSharedFilesystem);
    }
    file.record.name = detail::rank_file_name(request.rank, request.world_size);
    const std::string path = (temporary / file.record.name).string();
    save_safetensors(path, file.tensors, {{"format", "pt"}, {"dtrain_step", std::to_string(step)}});  // fsyncs
    file.record.bytes = detail::file_bytes(path);
    file.record.xxh64 = detail::file_xxh64(path);
    detail::slow_write_point(step, request.rank);
  } catch (const std::exception& e) {
    error = std::string("save_checkpoint: ") + e.what();
  }
  agree_or_clean_up(error);
  const auto records = detail::all_gather_strings(comm, detail::file_record_to_json(file.record, file.tensor_table));

  if (request.rank == 0) {
    try {
      CheckpointManifest manifest;
      manifest.format_version = detail::kCheckpointFormatVersion;
      manifest.step = step;
      manifest.world_size = request.world_size;
      manifest.strategy = request.strategy;
      manifest.optimizer = request.optimizer_kind;
      manifest.extra = request.extra;
      for (const auto& record : records) manifest.files.push_back(detail::file_record_from_json(record, manifest.tensors));
      for (const auto& f : manifest.files) {  // every rank wrote into the directory rank 0 sees
        std::error_code missing;
        if (static_cast<int64_t>(fs::file_size(temporary / f.name, missing)) != f.bytes || missing) {
          throw std::runtime_error(f.name + ", which its rank wrote, is not in " + temporary.string() +
                                   " as rank 0 sees it: " + kSharedFilesystem);
        }
      }
      // Optimizer state no rank wrote (e.g. before the first step) is no tensor.
      std::set<std::string> written;
      for (const auto& f : manifest.files) {
        for (const auto& piece : f.pieces) written.insert(piece.name);
      }
      for (auto it = manifest.tensors.begin(); it != manifest.tensors.end();) {
        const bool empty_tensor = std::find(it->second.shape.begin(), it->second.shape.end(), 0) != it->second.shape.end();
        it = it->first.rfind("optim/", 0) == 0 && !written.count(it->first) && !empty_tensor ? manifest.tensors.erase(it)
                                                                                                : std::next(it);
      }
      fsync_path(temporary.string());  // the rank files' directory entries
      detail::crash_point("before writing the manifest");
      // The manifest goes through the parser every load uses (pieces cover
      // each tensor exactly once, offsets and strides in range) before it
      // is written: a save that describes its pieces wrongly fails here,
      // naming the tensor, and the previous checkpoint stays in place.
      const std::string manifest_text = detail::manifest_to_json(manifest);
      detail::manifest_from_json(manifest_text, "the manifest this save was about to write");
      write_whole_file((temporary / detail::kManifestName).string(), manifest_text);
      fsync_path(temporary.string());
      detail::crash_point("after writing the manifest, before moving the checkpoint into place");
      replace_directory(temporary, target);
    } catch (const std::exception& e) {
      error = "save_checkpoint: " + target.string() + ": " + e.what();
    }
  }
  agree_or_clean_up(error);
}


}  // namespace detail

namespace {

void save_held(const std::string& dir, const detail::HeldModel& held, torch::optim::Optimizer* optimizer, int64_t step,
               const CommPtr& comm, const std::map<std::string, std::string>& extra) {
  torch::NoGradGuard no_grad;
  detail::SaveRequest request{dir, step, held.rank, held.world_size, held.strategy, held.optimizer_kind, extra};
  RankFile file;
  std::string error;
  try {
    if (request.optimizer_kind.empty()) request.optimizer_kind = detail::optimizer_kind(optimizer);
    file = detail::rank_file_of(held, optimizer);
  } catch (const std::exception& e) {
    error = e.what();  // write_checkpoint says "save_checkpoint: "
  }
  detail::write_checkpoint(request, file, std::move(error), comm);
}

}  // namespace

void save_checkpoint(const std::string& dir, torch::nn::Module& model, torch::optim::Optimizer* optimizer, int64_t step,
                     const CommPtr& comm, const std::map<std::string, std::string>& extra) {
  save_held(dir, detail::held_by_module(model, comm), optimizer, step, comm, extra);
}

void save_checkpoint(const std::string& dir, const HeldModel& held, torch::optim::Optimizer* optimizer, int64_t step,
                     const CommPtr& comm, const std::map<std::string, std::string>& extra) {
  save_held(dir, held, optimizer, step, comm, extra);
}

void save_checkpoint(const std::string& dir, FullyShardedBase& fsdp, torch::optim::Optimizer* optimizer, int64_t step,
                     const std::map<std::string, std::string>& extra) {
  save_held(dir, detail::held_by_fsdp(fsdp), optimizer, step, fsdp.comm(), extra);
}

}  // namespace dtrain
