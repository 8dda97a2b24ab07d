// Reads element ranges of tensors from one rank file of a sharded
// checkpoint without loading the whole file: the safetensors header once,
// then pread() of just the bytes a range needs (a rank loading at another
// world size touches only the parts of other ranks' files it overlaps).
#pragma once

#include "checkpoint/safetensors_format.h"

#include <dtrain/checkpoint_manifest.h>

#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

namespace dtrain::detail {

class RankFileReader {
 public:
  // Opens `path` and checks its header (as load_safetensors does).
  explicit RankFileReader(std::string path);
  ~RankFileReader();
  RankFileReader(const RankFileReader&) = delete;
  RankFileReader& operator=(const RankFileReader&) = delete;

  // Copies elements [first, first + destination.numel()) of the flattened
  // tensor `name` into the contiguous `destination`, whose dtype must be the
  // tensor's. Throws std::runtime_error naming the file.
  void read(const std::string& name, int64_t first, torch::Tensor destination) const;
  // The tensor's element count; throws if the file lacks it.
  int64_t numel(const std::string& name) const;
  // Every tensor the file holds, as its header lists them.
  const safetensors::Header& header() const { return header_; }
  const std::string& path() const { return path_; }

 private:
  const safetensors::TensorEntry& entry(const std::string& name) const;

  std::string path_;
  int fd_ = -1;
  safetensors::Header header_;
  std::map<std::string, size_t> index_;
};

// How rank file `reader` disagrees with the manifest's record of it, one
// line each (empty when it agrees): every piece the manifest lists has an
// entry of the tensor's dtype and of exactly the piece's element count, and
// the file holds nothing the manifest does not list. Reads only the header.
std::vector<std::string> rank_file_disagreements(const RankFileReader& reader, const CheckpointManifest::File& file,
                                                 const std::map<std::string, CheckpointManifest::Tensor>& tensors);

}  // namespace dtrain::detail
