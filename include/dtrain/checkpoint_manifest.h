// The manifest of a sharded checkpoint (manifest.json): what a checkpoint
// says about itself. Apart from dtrain/checkpoint.h so that it needs no
// LibTorch: `make fuzz` builds its parser with clang alone.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain {

// What a checkpoint says about itself (manifest.json).
struct CheckpointManifest {
  struct Tensor {
    std::string dtype;           // "float32", "int64", ... (dtrain::dtype_name)
    std::vector<int64_t> shape;  // global shape
  };
  // Elements of the flattened tensor `name`: [begin, end), or with count > 1
  // the runs [begin, end) + k * stride for k < count (a tensor-parallel
  // slice: the columns of a row-parallel weight). The file's entry for
  // `name` holds the pieces' elements one after another; this piece's start
  // at element `offset` of it (0 when a file holds one piece of `name`).
  struct Piece {
    std::string name;
    int64_t begin = 0, end = 0;
    int64_t offset = 0;
    int64_t stride = 0, count = 1;
    int64_t numel() const { return (end - begin) * count; }
  };
  struct File {
    std::string name;  // relative to the directory
    int64_t bytes = 0;
    uint64_t xxh64 = 0;
    std::vector<Piece> pieces;
  };
  int format_version = 2;  // 1: no strided pieces (offset 0, count 1); read as well
  int64_t step = 0;
  int world_size = 1;
  std::string strategy;   // a row of dtrain/strategy_table.h ("ddp", "fsdp", ...; older saves: "full", ...)
  std::string optimizer;  // "adamw", "adam", "sgd" or "none"
  std::map<std::string, std::string> extra;
  std::map<std::string, Tensor> tensors;
  std::vector<File> files;
};

// Reads DIR/manifest.json. Throws std::runtime_error naming the directory
// when it is missing, truncated or malformed (such a directory is no
// checkpoint, e.g. a save that was interrupted).
CheckpointManifest read_checkpoint_manifest(const std::string& dir);

// One line per problem with a file: its size or xxHash64 differs from the
// manifest ("rank-00001-of-00002.safetensors: checksum ..."), or its header
// disagrees with the manifest's pieces (a missing entry, another dtype or
// element count, an entry the manifest does not list); empty when all match.
// With `checksums` false only the sizes are compared: a stat per file, no
// reading, for a quick look before a load that verifies everything anyway.
std::vector<std::string> verify_checkpoint_files(const std::string& dir, const CheckpointManifest& manifest,
                                                 bool checksums = true);

// Thrown by the loaders (dtrain/checkpoint.h) when a file's size or checksum
// differs from the manifest. They check every file before reading any
// tensor, so nothing was loaded: a caller may try an older checkpoint.
class CheckpointDamagedError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace dtrain
