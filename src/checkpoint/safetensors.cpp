// safetensors files of LibTorch tensors (include/dtrain/checkpoint.h): the
// file I/O and dtype mapping on top of the torch-free format code in
// safetensors_format.{h,cpp} (see Note [safetensors layout] there).
#include "dtrain/checkpoint.h"

#include "checkpoint/fault_injection.h"
#include "checkpoint/safetensors_format.h"
#include "checkpoint/state_fit.h"

#include <torch/nn/module.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace dtrain {
namespace {

namespace st = safetensors;

struct DTypePair {
  st::DType file;
  torch::ScalarType torch;
};
const DTypePair kDTypePairs[] = {
    {st::DType::BOOL, torch::kBool},         {st::DType::U8, torch::kUInt8},
    {st::DType::I8, torch::kInt8},           {st::DType::I16, torch::kInt16},
    {st::DType::U16, torch::kUInt16},        {st::DType::I32, torch::kInt32},
    {st::DType::U32, torch::kUInt32},        {st::DType::I64, torch::kInt64},
    {st::DType::U64, torch::kUInt64},        {st::DType::F8_E5M2, torch::kFloat8_e5m2},
    {st::DType::F8_E4M3, torch::kFloat8_e4m3fn}, {st::DType::F16, torch::kFloat16},
    {st::DType::BF16, torch::kBFloat16},     {st::DType::F32, torch::kFloat32},
    {st::DType::F64, torch::kFloat64},
};

torch::ScalarType torch_dtype(st::DType dtype) {
  for (const auto& pair : kDTypePairs)
    if (pair.file == dtype) return pair.torch;
  throw std::logic_error("safetensors dtype without a LibTorch dtype");
}

std::optional<st::DType> file_dtype(torch::ScalarType dtype) {
  for (const auto& pair : kDTypePairs)
    if (pair.torch == dtype) return pair.file;
  return std::nullopt;
}

// "F32" where the format has a name for it, else LibTorch's ("ComplexFloat").
std::string dtype_text(torch::ScalarType dtype) {
  const auto in_file = file_dtype(dtype);
  return in_file ? st::dtype_name(*in_file) : c10::toString(dtype);
}

std::string shape_text(torch::IntArrayRef sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? ", " : "") + std::to_string(sizes[i]);
  return text + "]";
}

std::string os_reason(int error) { return std::strerror(error); }

// ----------------------------------------------------------------- writing

// `path`.tmp while it is being written: closed and removed unless committed.
class TempFile {
 public:
  TempFile(std::string final_path) : path_(std::move(final_path)), temp_(path_ + ".tmp") {
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create the temporary file " + temp_);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_.c_str());
  }

  void write(const void* data, size_t size) {
    const char* bytes = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t written = detail::write_to_disk(fd_, bytes, std::min<size_t>(size, size_t{1} << 30));
      if (written < 0 && errno == EINTR) continue;
      if (written < 0) fail("writing " + temp_);
      bytes += written;
      size -= static_cast<size_t>(written);
    }
  }

  // Flushes, closes and renames over the final path, then flushes the folder
  // (best effort: the new file is in place whether or not that succeeds).
  void commit() {
    if (::fsync(fd_) != 0) fail("flushing " + temp_ + " to disk");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("closing " + temp_);
    detail::crash_point("after writing a safetensors file, before renaming it into place");
    if (::rename(temp_.c_str(), path_.c_str()) != 0) fail("renaming " + temp_ + " to it");
    committed_ = true;
    detail::crash_point("after renaming a safetensors file into place");
    const std::string folder = path_.find('/') == std::string::npos ? "." : path_.substr(0, path_.rfind('/') + 1);
    const int folder_fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (folder_fd >= 0) {
      ::fsync(folder_fd);
      ::close(folder_fd);
    }
  }

 private:
  [[noreturn]] void fail(const std::string& doing) const {
    throw std::runtime_error("cannot write " + path_ + ": " + doing + ": " + os_reason(errno));
  }

  std::string path_;
  std::string temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// ----------------------------------------------------------------- reading

class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw std::runtime_error("cannot read " + path + ": " + os_reason(errno));
    struct stat info {};
    std::string problem;
    if (::fstat(fd_, &info) != 0) problem = os_reason(errno);
    else if (S_ISDIR(info.st_mode)) problem = "it is a folder";
    else if (!S_ISREG(info.st_mode)) problem = "it is not a regular file";
    if (!problem.empty()) {
      ::close(fd_);
      throw std::runtime_error("cannot read " + path + ": " + problem);
    }
    size_ = static_cast<uint64_t>(info.st_size);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() { ::close(fd_); }

  uint64_t size() const { return size_; }

  void read(void* data, uint64_t size, uint64_t offset) const {
    char* bytes = static_cast<char*>(data);
    while (size > 0) {
      const ssize_t got = ::pread(fd_, bytes, std::min<uint64_t>(size, uint64_t{1} << 30), static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw std::runtime_error("cannot read " + path_ + ": " + os_reason(errno));
      if (got == 0)
        throw std::runtime_error(path_ + ": the file ended at byte " + std::to_string(offset) +
                                 ", before the end its header gave (did it change while being read?)");
      bytes += got;
      offset += static_cast<uint64_t>(got);
      size -= static_cast<uint64_t>(got);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Bytes other than 0 and 1 in a bool tensor are undefined behaviour to LibTorch.
void check_bool_bytes(const std::string& path, const std::string& name, const torch::Tensor& tensor) {
  const auto* bytes = static_cast<const uint8_t*>(tensor.data_ptr());
  const int64_t count = tensor.numel();
  for (int64_t i = 0; i < count; ++i)
    if (bytes[i] > 1)
      throw std::runtime_error(path + ": tensor '" + name + "' (BOOL) holds the byte " + std::to_string(bytes[i]) +
                               " at element " + std::to_string(i) + "; BOOL bytes must be 0 or 1");
}

// Widening one floating-point type into a wider one is exact; see load_state_into.
bool widens(torch::ScalarType from, torch::ScalarType to) {
  if (from == to) return true;
  const bool half = from == torch::kFloat16 || from == torch::kBFloat16;
  if (half && (to == torch::kFloat32 || to == torch::kFloat64)) return true;
  return from == torch::kFloat32 && to == torch::kFloat64;
}

std::string list_some(const std::vector<std::string>& names) {
  constexpr size_t kShown = 5;
  std::string text;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) text += (i ? ", '" : "'") + names[i] + "'";
  if (names.size() > kShown) text += " and " + std::to_string(names.size() - kShown) + " more";
  return text;
}

}  // namespace

namespace detail {

torch::ScalarType torch_dtype_of(safetensors::DType dtype) { return torch_dtype(dtype); }

void check_state_fits(const std::string& where, const std::vector<TensorSignature>& model,
                      const std::vector<TensorSignature>& file) {
  std::unordered_map<std::string, const TensorSignature*> in_file;
  for (const auto& tensor : file) in_file.emplace(tensor.name, &tensor);
  std::unordered_set<std::string> in_module;
  std::vector<std::string> file_lacks, module_lacks;
  for (const auto& tensor : model) {
    in_module.insert(tensor.name);
    if (!in_file.count(tensor.name)) file_lacks.push_back(tensor.name);
  }
  for (const auto& tensor : file)
    if (!in_module.count(tensor.name)) module_lacks.push_back(tensor.name);
  if (!file_lacks.empty() || !module_lacks.empty()) {
    std::string message = where + " does not fit the model:";
    if (!file_lacks.empty())
      message += " the model's " + list_some(file_lacks) + (file_lacks.size() == 1 ? " is" : " are") + " missing from the file";
    if (!file_lacks.empty() && !module_lacks.empty()) message += ";";
    if (!module_lacks.empty())
      message += " the file's " + list_some(module_lacks) + (module_lacks.size() == 1 ? " is" : " are") +
                 " not in the model";
    throw std::runtime_error(message + " (the file holds " + std::to_string(file.size()) + " tensors, the model " +
                             std::to_string(model.size()) + ")");
  }
  for (const auto& target : model) {
    const TensorSignature& source = *in_file.at(target.name);
    if (source.shape != target.shape)
      throw std::runtime_error(where + ": tensor '" + target.name + "' has shape " + shape_text(source.shape) +
                               " in the file but " + shape_text(target.shape) + " in the model");
    if (!widens(source.dtype, target.dtype))
      throw std::runtime_error(where + ": tensor '" + target.name + "' is " + dtype_text(source.dtype) +
                               " in the file but " + dtype_text(target.dtype) +
                               " in the model (only widening float16/bfloat16/float32 is converted)");
  }
}

}  // namespace detail

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> result;
  result.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) result.push_back(name);
  return result;
}

const torch::Tensor* SafetensorsFile::find(const std::string& name) const {
  for (const auto& [tensor_name, tensor] : tensors)
    if (tensor_name == name) return &tensor;
  return nullptr;
}

const torch::Tensor& SafetensorsFile::at(const std::string& name) const {
  if (const torch::Tensor* tensor = find(name)) return *tensor;
  throw std::out_of_range((path.empty() ? std::string("the safetensors file") : path) + " has no tensor '" + name + "'");
}

void save_safetensors_streamed(const std::string& path, const std::vector<SafetensorsEntry>& entries_in,
                               const std::function<torch::Tensor(size_t)>& tensor_at,
                               const std::map<std::string, std::string>& metadata) {
  // Everything that can be checked is checked before the disk is touched.
  std::vector<st::TensorEntry> entries;
  entries.reserve(entries_in.size());
  uint64_t offset = 0;
  for (const auto& in : entries_in) {
    const std::string where = "cannot write " + path + ": tensor '" + in.name + "' ";
    const auto dtype = file_dtype(in.dtype);
    if (!dtype) throw std::runtime_error(where + "has dtype " + dtype_text(in.dtype) + ", which safetensors cannot hold");
    st::TensorEntry entry;
    entry.name = in.name;
    entry.dtype = *dtype;
    entry.shape = in.shape;
    entry.begin = offset;
    int64_t numel = 1;
    for (int64_t size : in.shape) numel *= size;
    offset += static_cast<uint64_t>(numel) * st::dtype_size(*dtype);
    entry.end = offset;
    entries.push_back(std::move(entry));
  }
  std::string header;
  try {
    header = st::serialize_header(entries, metadata);
  } catch (const st::FormatError& error) {
    throw std::runtime_error("cannot write " + path + ": " + error.what());
  }

  TempFile file(path);
  file.write(header.data(), header.size());
  for (size_t i = 0; i < entries_in.size(); ++i) {
    // One tensor at a time on the CPU, so saving needs little extra memory.
    const torch::Tensor bytes = tensor_at(i).detach().to(torch::kCPU).resolve_conj().resolve_neg().contiguous();
    if (bytes.scalar_type() != entries_in[i].dtype || bytes.sizes().vec() != entries_in[i].shape) {
      throw std::logic_error("cannot write " + path + ": tensor '" + entries_in[i].name +
                             "' is not the dtype and shape its header entry says");
    }
    file.write(bytes.data_ptr(), bytes.nbytes());
  }
  file.commit();
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsEntry> entries;
  entries.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const std::string where = "cannot write " + path + ": tensor '" + name + "' ";
    if (!tensor.defined()) throw std::runtime_error(where + "is undefined");
    if (tensor.layout() != torch::kStrided) throw std::runtime_error(where + "is not a dense (strided) tensor");
    entries.push_back({name, tensor.scalar_type(), tensor.sizes().vec()});
  }
  save_safetensors_streamed(path, entries, [&](size_t i) { return tensors[i].second; }, metadata);
}

SafetensorsFile load_safetensors(const std::string& path) {
  InputFile input(path);
  st::Header header;
  try {
    uint8_t prefix[st::kLengthBytes] = {};
    input.read(prefix, std::min<uint64_t>(input.size(), st::kLengthBytes), 0);
    const uint64_t length = st::parse_header_length(prefix, input.size());
    std::string json(length, '\0');
    input.read(json.data(), length, st::kLengthBytes);
    header = st::parse_header(json.data(), json.size(), input.size() - st::kLengthBytes - length);
    header.data_offset = st::kLengthBytes + length;
  } catch (const st::FormatError& error) {
    throw std::runtime_error(path + ": not a valid safetensors file: " + error.what());
  }

  // The tensors cover the data exactly (checked), so this allocates what the
  // file holds, no more.
  SafetensorsFile file;
  file.path = path;
  file.metadata = std::move(header.metadata);
  file.tensors.reserve(header.tensors.size());
  for (auto& entry : header.tensors) {
    torch::Tensor tensor = torch::empty(entry.shape, torch::TensorOptions().dtype(torch_dtype(entry.dtype)));
    input.read(tensor.data_ptr(), entry.nbytes(), header.data_offset + entry.begin);
    if (entry.dtype == st::DType::BOOL) check_bool_bytes(path, entry.name, tensor);
    file.tensors.emplace_back(std::move(entry.name), std::move(tensor));
  }
  return file;
}

void save_module_safetensors(const torch::nn::Module& module, const std::string& path,
                             const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) tensors.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    if (item.value().defined()) tensors.emplace_back(item.key(), item.value());
  save_safetensors(path, tensors, metadata);
}

void load_state_into(torch::nn::Module& module, const SafetensorsFile& file) {
  const std::string where = file.path.empty() ? std::string("the safetensors file") : file.path;
  std::vector<std::pair<std::string, torch::Tensor>> targets;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) targets.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    if (item.value().defined()) targets.emplace_back(item.key(), item.value());

  std::vector<detail::TensorSignature> wanted, held;
  for (const auto& [name, tensor] : targets) wanted.push_back({name, tensor.sizes().vec(), tensor.scalar_type()});
  std::unordered_map<std::string, const torch::Tensor*> in_file;
  for (const auto& [name, tensor] : file.tensors) {
    in_file.emplace(name, &tensor);
    held.push_back({name, tensor.sizes().vec(), tensor.scalar_type()});
  }
  detail::check_state_fits(where, wanted, held);
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : targets) target.copy_(*in_file.at(name));
}

}  // namespace dtrain
