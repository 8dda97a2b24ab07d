// The safetensors file format, without LibTorch: parsing and checking a
// header, and writing one. The torch-facing reader and writer
// (include/dtrain/checkpoint.h, safetensors.cpp) sit on top; the fuzzer
// (tests/checkpoint/fuzz_safetensors.cpp) drives this part alone, compiled
// with clang and sanitizers in seconds.
//
// Note [safetensors layout]
// A file is
//   8 bytes   N, the header's length, an unsigned 64-bit little-endian integer
//   N bytes   the header: UTF-8 JSON, an object that starts with '{' and may be
//             padded at the end with spaces. Each key is a tensor's name, its
//             value {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]};
//             the optional key "__metadata__" maps strings to strings.
//   the rest  the data buffer. A tensor's bytes are [BEGIN, END) of it (offsets
//             relative to the buffer, not the file), row-major, little-endian.
// The tensors' ranges cover the buffer exactly: no byte belongs to two
// tensors and none to no tensor (empty tensors have BEGIN == END). Names are
// unique. Shape [] is a scalar (one element).
//
// Every check below runs before anything is allocated from the file's
// numbers, so a hostile file can make a reader allocate at most its own size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::safetensors {

// The reference implementation's limit; real headers are kilobytes to a few MB.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The length prefix before the header.
inline constexpr uint64_t kLengthBytes = 8;

enum class DType { BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F8_E5M2, F8_E4M3, F16, BF16, F32, F64 };

// "F32", ...; the spelling in the header.
const char* dtype_name(DType dtype);
// Bytes per element.
uint64_t dtype_size(DType dtype);
std::optional<DType> dtype_from_name(std::string_view name);
// Every name dtype_from_name() knows, comma-separated, for error messages.
std::string dtype_names();

// A malformed header or file. The message says what is wrong; the caller adds
// the file's name.
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TensorEntry {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // each >= 0; [] is a scalar
  uint64_t begin = 0;          // data_offsets, relative to the data buffer
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
  // The product of the shape (1 for a scalar); valid after checking.
  uint64_t numel() const;
};

struct Header {
  std::vector<TensorEntry> tensors;  // in the order the header lists them
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  // where the data buffer starts in the file: 8 + N
  uint64_t data_size = 0;    // its length in bytes
};

// N from the file's first 8 bytes, checked against the file's size: at least
// 2 (the shortest object, "{}"), at most the bytes after the prefix and at
// most kMaxHeaderBytes. Throws FormatError.
uint64_t parse_header_length(const uint8_t* prefix, uint64_t file_size);

// Parses the N header bytes `json` of a file whose data buffer holds
// `data_size` bytes, and checks everything Note [safetensors layout] asks.
// Header::data_offset is left 0 (the caller knows N). Throws FormatError
// naming the first problem found (and the tensor, where there is one).
Header parse_header(const char* json, size_t json_size, uint64_t data_size);

// The header of a whole file held in memory (`size` bytes at `data`): the
// length prefix, then parse_header(). The tensors' bytes are then
// data[data_offset + begin, data_offset + end), all inside the buffer.
Header parse_safetensors_header(const uint8_t* data, size_t size);

// The bytes that precede the data: the 8-byte length and the header, compact
// JSON ("__metadata__" first when there is any, then the tensors in the
// given order) padded with spaces to a multiple of 8 bytes so that the data
// starts 8-byte aligned (as Hugging Face's writer does). The entries' offsets
// must already be set. Throws FormatError for a duplicate name, a tensor
// named "__metadata__", or a name or metadata string that is not UTF-8.
std::string serialize_header(const std::vector<TensorEntry>& tensors,
                             const std::map<std::string, std::string>& metadata);

}  // namespace dtrain::safetensors
