// Checks a checkpoint's files against its manifest: sizes, checksums, and
// that each file's safetensors header holds exactly the pieces the manifest
// says, in the manifest's dtypes (the validation pass before any load).
#include "checkpoint/manifest.h"
#include "checkpoint/rank_file_reader.h"

#include <dtrain/checkpoint_manifest.h>

#include <filesystem>
#include <string>
#include <vector>

namespace dtrain {

std::vector<std::string> verify_checkpoint_files(const std::string& dir, const CheckpointManifest& manifest,
                                                 bool checksums) {
  std::vector<std::string> problems;
  for (const auto& file : manifest.files) {
    const std::string path = (std::filesystem::path(dir) / file.name).string();
    try {
      const int64_t bytes = detail::file_bytes(path);
      if (bytes != file.bytes) {
        problems.push_back(file.name + ": " + std::to_string(bytes) + " bytes, the manifest says " +
                           std::to_string(file.bytes));
        continue;
      }
      if (!checksums) continue;
      const uint64_t hash = detail::file_xxh64(path);
      if (hash != file.xxh64) {
        problems.push_back(file.name + ": xxh64 checksum does not match the manifest (file damaged)");
        continue;
      }
      // The checksum proves the bytes are the ones the saver wrote, not that
      // the manifest describes them: a hand-edited or hostile manifest with
      // a matching checksum must still agree with each file's header.
      const auto disagreements = detail::rank_file_disagreements(detail::RankFileReader(path), file, manifest.tensors);
      problems.insert(problems.end(), disagreements.begin(), disagreements.end());
    } catch (const std::exception& error) {
      problems.push_back(file.name + ": " + error.what());
    }
  }
  return problems;
}

}  // namespace dtrain
