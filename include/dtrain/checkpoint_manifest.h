// The manifest of a sharded checkpoint (manifest.json): what a checkpoint
// says about itself. Apart from dtrain/checkpoint.h so that it needs no
// LibTorch: `make fuzz` builds its parser with clang alone.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain {

// What a checkpoint says about itself (manifest.json).
struct CheckpointManifest {
  struct Tensor {
    std::string dtype;           // "float32", "int64", ... (dtrain::dtype_name)
    std::vector<int64_t> shape;  // global shape
  };
  struct Piece {
    std::string name;
    int64_t begin = 0, end = 0;  // elements of the flattened tensor
  };
  struct File {
    std::string name;  // relative to the directory
    int64_t bytes = 0;
    uint64_t xxh64 = 0;
    std::vector<Piece> pieces;
  };
  int format_version = 1;
  int64_t step = 0;
  int world_size = 1;
  std::string strategy;   // "single", "ddp", or an FSDP strategy ("full", "gradop", ...)
  std::string optimizer;  // "adamw", "adam", "sgd" or "none"
  std::map<std::string, std::string> extra;
  std::map<std::string, Tensor> tensors;
  std::vector<File> files;
};

// Reads DIR/manifest.json. Throws std::runtime_error naming the directory
// when it is missing, truncated or malformed (such a directory is no
// checkpoint, e.g. a save that was interrupted).
CheckpointManifest read_checkpoint_manifest(const std::string& dir);

// One line per file whose size or xxHash64 differs from the manifest
// ("rank-00001-of-00002.safetensors: checksum ..."); empty when all match.
std::vector<std::string> verify_checkpoint_files(const std::string& dir, const CheckpointManifest& manifest);

}  // namespace dtrain
