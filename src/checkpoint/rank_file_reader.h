// Reads element ranges of tensors from one rank file of a sharded
// checkpoint without loading the whole file: the safetensors header once,
// then pread() of just the bytes a range needs (a rank loading at another
// world size touches only the parts of other ranks' files it overlaps).
#pragma once

#include "checkpoint/safetensors_format.h"

#include <torch/types.h>

#include <map>
#include <string>

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

}  // namespace dtrain::detail
