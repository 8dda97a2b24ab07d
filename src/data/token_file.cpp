// Token files (include/dtrain/data.h): nanoGPT's flat arrays and llm.c's
// header-prefixed ones, read whole into int32 ids.
#include "dtrain/data.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dtrain::data {

namespace fs = std::filesystem;

namespace {

// llm.c (dev/data/data_common.py): 256 int32, then the ids.
constexpr int64_t kHeaderInts = 256;
constexpr int64_t kHeaderBytes = kHeaderInts * 4;
constexpr int32_t kMagicUInt16 = 20240520;  // GPT-2 tokens, version 1
constexpr int32_t kMagicUInt32 = 20240801;  // Llama 3 tokens, version 7

std::vector<char> read_bytes(const std::string& path) {
  std::error_code error;
  if (!fs::is_regular_file(path, error)) throw std::runtime_error("token file " + path + ": no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("token file " + path + ": cannot be read");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<size_t>(in.tellg());
  in.seekg(0);
  std::vector<char> bytes(size);
  if (size > 0 && !in.read(bytes.data(), static_cast<std::streamsize>(size)))
    throw std::runtime_error("token file " + path + ": read failed");
  return bytes;
}

int32_t header_int(const std::vector<char>& bytes, int64_t index) {
  int32_t value = 0;
  std::memcpy(&value, bytes.data() + index * 4, 4);  // little-endian, as numpy writes it on x86
  return value;
}

template <typename Id>
torch::Tensor ids_from(const char* data, int64_t count) {
  auto tokens = torch::empty({count}, torch::kInt32);
  auto* out = tokens.data_ptr<int32_t>();
  for (int64_t i = 0; i < count; ++i) {
    Id id;
    std::memcpy(&id, data + i * static_cast<int64_t>(sizeof(Id)), sizeof(Id));
    if (static_cast<uint64_t>(id) > static_cast<uint64_t>(INT32_MAX))
      throw std::runtime_error("token id " + std::to_string(static_cast<uint64_t>(id)) + " does not fit int32");
    out[i] = static_cast<int32_t>(id);
  }
  return tokens;
}

std::string file_name(const fs::path& path) { return path.filename().string(); }

}  // namespace

TokenFormat token_format_from(const std::string& name) {
  if (name == "auto") return TokenFormat::Auto;
  if (name == "uint16") return TokenFormat::UInt16;
  if (name == "uint32") return TokenFormat::UInt32;
  throw std::invalid_argument("token format '" + name + "' is not one of: auto, uint16, uint32");
}

TokenFile read_token_file(const std::string& path, TokenFormat format) {
  const std::vector<char> bytes = read_bytes(path);
  const auto size = static_cast<int64_t>(bytes.size());
  if (size == 0) throw std::runtime_error("token file " + path + " is empty");
  const int32_t magic = size >= 4 ? header_int(bytes, 0) : 0;
  TokenFile file;
  if (format == TokenFormat::Auto && (magic == kMagicUInt16 || magic == kMagicUInt32)) {
    const bool wide = magic == kMagicUInt32;
    const char* kind = wide ? "llm.c uint32" : "llm.c uint16";
    if (size < kHeaderBytes)
      throw std::runtime_error("token file " + path + " starts with llm.c's magic " + std::to_string(magic) +
                               " but has " + std::to_string(size) + " bytes, fewer than its 1024-byte header: the "
                               "file is cut short");
    const int64_t count = header_int(bytes, 2);
    const int64_t width = wide ? 4 : 2;
    const int64_t body = size - kHeaderBytes;
    if (count < 0 || body != count * width)
      throw std::runtime_error("token file " + path + " (" + kind + "): the header counts " + std::to_string(count) +
                               " tokens, but " + std::to_string(body) + " bytes follow it (" +
                               std::to_string(count * width) + " expected): the file is cut short or not llm.c's");
    const char* data = bytes.data() + kHeaderBytes;
    file.tokens = wide ? ids_from<uint32_t>(data, count) : ids_from<uint16_t>(data, count);
    file.layout = kind;
  } else {
    const bool wide = format == TokenFormat::UInt32;
    const int64_t width = wide ? 4 : 2;
    if (size % width != 0)
      throw std::runtime_error("token file " + path + " has " + std::to_string(size) + " bytes, not a whole number of " +
                               (wide ? "uint32" : "uint16") + " ids (" + std::to_string(width) +
                               " bytes each): a truncated file, or another format (--token-dtype)");
    file.tokens = wide ? ids_from<uint32_t>(bytes.data(), size / width) : ids_from<uint16_t>(bytes.data(), size / width);
    file.layout = wide ? "nanoGPT uint32" : "nanoGPT uint16";
  }
  if (file.tokens.numel() == 0) throw std::runtime_error("token file " + path + " holds no tokens");
  return file;
}

TokenCorpus read_token_corpus(const std::string& path, TokenFormat format, double validation_fraction) {
  std::error_code error;
  TokenCorpus corpus;
  if (!fs::is_directory(path, error)) {
    TokenFile file = read_token_file(path, format);
    const int64_t n = file.tokens.numel();
    const auto validation = static_cast<int64_t>(std::floor(static_cast<double>(n) * validation_fraction));
    corpus.train = file.tokens.narrow(0, 0, n - validation);
    corpus.validation = file.tokens.narrow(0, n - validation, validation);
    corpus.files = {path};
    corpus.layout = file.layout;
    return corpus;
  }
  if (!fs::exists(path, error)) throw std::runtime_error("token files " + path + ": no such file or folder");
  std::vector<fs::path> train, validation;
  for (const auto& entry : fs::directory_iterator(path)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".bin") continue;
    const std::string name = file_name(entry.path());
    if (name == "train.bin" || name.ends_with("_train.bin")) train.push_back(entry.path());
    if (name == "val.bin" || name.ends_with("_val.bin")) validation.push_back(entry.path());
  }
  if (train.size() != 1 || validation.size() != 1)
    throw std::runtime_error("token folder " + path + " has " + std::to_string(train.size()) + " train and " +
                             std::to_string(validation.size()) +
                             " validation files; it needs exactly one of each, named train.bin and val.bin (nanoGPT) "
                             "or NAME_train.bin and NAME_val.bin (llm.c), or pass one file (its last " +
                             std::to_string(static_cast<int>(validation_fraction * 100)) + "% validates)");
  TokenFile train_file = read_token_file(train.front().string(), format);
  TokenFile validation_file = read_token_file(validation.front().string(), format);
  corpus.train = train_file.tokens;
  corpus.validation = validation_file.tokens;
  corpus.files = {train.front().string(), validation.front().string()};
  corpus.layout = train_file.layout == validation_file.layout ? train_file.layout
                                                              : train_file.layout + " / " + validation_file.layout;
  return corpus;
}

}  // namespace dtrain::data
