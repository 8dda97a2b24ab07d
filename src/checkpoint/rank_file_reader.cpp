#include "checkpoint/rank_file_reader.h"

#include "checkpoint/state_fit.h"

#include <dtrain/comm.h>

#include <torch/types.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <set>
#include <stdexcept>
#include <vector>

namespace dtrain::detail {
namespace {

namespace st = safetensors;

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian; copying needs a little-endian host");

// The file dtype a checkpoint tensor of `dtype` is stored as.
std::optional<st::DType> file_dtype(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32: return st::DType::F32;
    case torch::kFloat64: return st::DType::F64;
    case torch::kFloat16: return st::DType::F16;
    case torch::kBFloat16: return st::DType::BF16;
    case torch::kInt64: return st::DType::I64;
    case torch::kInt32: return st::DType::I32;
    case torch::kInt16: return st::DType::I16;
    case torch::kInt8: return st::DType::I8;
    case torch::kUInt8: return st::DType::U8;
    case torch::kBool: return st::DType::BOOL;
    default: return std::nullopt;
  }
}

void pread_all(int fd, void* data, uint64_t size, uint64_t offset, const std::string& path) {
  auto* bytes = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t got = ::pread(fd, bytes, std::min<uint64_t>(size, uint64_t{1} << 30), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) throw std::runtime_error(path + ": read failed: " + (got == 0 ? "file shorter than its header says" : std::strerror(errno)));
    bytes += got;
    size -= static_cast<uint64_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

}  // namespace

RankFileReader::RankFileReader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error(path_ + ": cannot open: " + std::strerror(errno));
  try {
    struct stat info {};
    if (::fstat(fd_, &info) != 0) throw std::runtime_error(path_ + ": cannot stat: " + std::strerror(errno));
    const auto size = static_cast<uint64_t>(info.st_size);
    uint8_t prefix[st::kLengthBytes] = {};
    pread_all(fd_, prefix, std::min<uint64_t>(size, st::kLengthBytes), 0, path_);
    const uint64_t length = st::parse_header_length(prefix, size);
    std::vector<char> json(length);
    pread_all(fd_, json.data(), length, st::kLengthBytes, path_);
    header_ = st::parse_header(json.data(), json.size(), size - st::kLengthBytes - length);
    header_.data_offset = st::kLengthBytes + length;
  } catch (const st::FormatError& error) {
    ::close(fd_);
    throw std::runtime_error(path_ + ": not a valid safetensors file: " + error.what());
  } catch (...) {
    ::close(fd_);
    throw;
  }
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_[header_.tensors[i].name] = i;
}

RankFileReader::~RankFileReader() {
  if (fd_ >= 0) ::close(fd_);
}

const st::TensorEntry& RankFileReader::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw std::runtime_error(path_ + ": has no tensor '" + name + "' although the manifest lists it");
  return header_.tensors[it->second];
}

int64_t RankFileReader::numel(const std::string& name) const { return static_cast<int64_t>(entry(name).numel()); }

void RankFileReader::read(const std::string& name, int64_t first, torch::Tensor destination) const {
  const auto& tensor = entry(name);
  const auto wanted = file_dtype(destination.scalar_type());
  if (!wanted || *wanted != tensor.dtype) {
    throw std::runtime_error(path_ + ": '" + name + "' is " + st::dtype_name(tensor.dtype) + " but the model's is " +
                             dtype_name(destination.scalar_type()));
  }
  const int64_t count = destination.numel();
  if (first < 0 || first + count > static_cast<int64_t>(tensor.numel())) {
    throw std::runtime_error(path_ + ": '" + name + "' has " + std::to_string(tensor.numel()) +
                             " elements, fewer than the manifest says");
  }
  if (!destination.is_contiguous()) throw std::logic_error("RankFileReader::read needs a contiguous destination");
  const uint64_t element = st::dtype_size(tensor.dtype);
  pread_all(fd_, destination.data_ptr(), static_cast<uint64_t>(count) * element,
            header_.data_offset + tensor.begin + static_cast<uint64_t>(first) * element, path_);
  if (tensor.dtype == st::DType::BOOL) {
    const auto* bytes = static_cast<const uint8_t*>(destination.data_ptr());
    for (int64_t i = 0; i < count; ++i) {
      if (bytes[i] > 1) throw std::runtime_error(path_ + ": '" + name + "' holds a BOOL byte other than 0 or 1");
    }
  }
}

std::vector<std::string> rank_file_disagreements(const RankFileReader& reader, const CheckpointManifest::File& file,
                                                 const std::map<std::string, CheckpointManifest::Tensor>& tensors) {
  std::vector<std::string> problems;
  std::map<std::string, const st::TensorEntry*> entries;
  for (const auto& entry : reader.header().tensors) entries[entry.name] = &entry;
  // A file's entry for a tensor holds its pieces one after another.
  std::map<std::string, int64_t> listed;
  for (const auto& piece : file.pieces) listed[piece.name] += piece.numel();
  for (const auto& [name, elements] : listed) {
    auto entry = entries.find(name);
    if (entry == entries.end()) {
      problems.push_back(file.name + ": has no tensor '" + name + "' although the manifest lists a piece of it");
      continue;
    }
    const auto& saved = *entry->second;
    auto tensor = tensors.find(name);
    const std::string dtype = tensor == tensors.end() ? "?" : tensor->second.dtype;
    if (dtype_name(torch_dtype_of(saved.dtype)) != dtype) {
      problems.push_back(file.name + ": '" + name + "' is stored as " + st::dtype_name(saved.dtype) +
                         " but the manifest says " + dtype);
    }
    if (static_cast<int64_t>(saved.numel()) != elements) {
      problems.push_back(file.name + ": '" + name + "' has " + std::to_string(saved.numel()) +
                         " elements but the manifest's pieces of it have " + std::to_string(elements));
    }
  }
  for (const auto& [name, entry] : entries) {
    if (!listed.count(name)) problems.push_back(file.name + ": holds '" + name + "', which the manifest does not list");
  }
  return problems;
}

}  // namespace dtrain::detail
