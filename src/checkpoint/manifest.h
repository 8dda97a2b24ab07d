// manifest.json of a sharded checkpoint: JSON form, file names, checksums.
// See "sharded checkpoints" in include/dtrain/checkpoint.h.
#pragma once

#include <dtrain/checkpoint_manifest.h>

#include <cstdint>
#include <string>

namespace dtrain::detail {

// 2: pieces may be strided, and a file may hold several pieces of one tensor
// (tensor parallelism); version 1 manifests are read as they are.
inline constexpr int kCheckpointFormatVersion = 2;
inline constexpr const char* kManifestName = "manifest.json";

// "rank-00001-of-00004.safetensors"
std::string rank_file_name(int rank, int world_size);

// xxHash64 (seed 0) of a whole file; throws std::runtime_error naming it.
uint64_t file_xxh64(const std::string& path);
int64_t file_bytes(const std::string& path);

std::string file_record_to_json(const CheckpointManifest::File& file,
                                const std::map<std::string, CheckpointManifest::Tensor>& tensors);
// Adds the record's tensors to `tensors` (the same name must agree).
CheckpointManifest::File file_record_from_json(const std::string& text,
                                               std::map<std::string, CheckpointManifest::Tensor>& tensors);

std::string manifest_to_json(const CheckpointManifest& manifest);
// Throws std::runtime_error "WHERE: problem" for anything incomplete.
CheckpointManifest manifest_from_json(const std::string& text, const std::string& where);

}  // namespace dtrain::detail
