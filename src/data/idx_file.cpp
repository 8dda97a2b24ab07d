#include "data/idx_file.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>

namespace dtrain::data {

namespace {

constexpr uint8_t kUnsignedByte = 0x08;
// Far above any real dataset (Fashion-MNIST's train images are 47 MB), low
// enough that a corrupt header cannot make us allocate the whole machine.
constexpr int64_t kMaxElements = int64_t{1} << 36;

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

std::string join_dims(const std::vector<int64_t>& dims) {
  std::string text;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) text += "x";
    text += dims[i] < 0 ? std::string("N") : std::to_string(dims[i]);
  }
  return text;
}

class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path) {
    file_.reset(gzopen(path.c_str(), "rb"));
    if (!file_) fail(std::string("cannot open: ") + std::strerror(errno));
    gzbuffer(file_.get(), 1 << 17);  // fewer, larger reads of the compressed file
  }

  [[noreturn]] void fail(const std::string& what) const { throw std::runtime_error(path_ + ": " + what); }

  // Reads up to n bytes; returns how many there were. Stops early only at
  // the end of the data; zlib errors throw.
  size_t read(void* out, size_t n) {
    auto* bytes = static_cast<unsigned char*>(out);
    size_t got = 0;
    while (got < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30));
      const int r = gzread(file_.get(), bytes + got, chunk);
      check_error();
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    return got;
  }

  // Whether the compressed stream itself ended early (rather than the IDX
  // body being short inside a complete gzip file).
  bool stream_cut_short() const {
    int errnum = Z_OK;
    gzerror(file_.get(), &errnum);
    return errnum == Z_BUF_ERROR;
  }

 private:
  void check_error() const {
    int errnum = Z_OK;
    const char* message = gzerror(file_.get(), &errnum);
    if (errnum == Z_ERRNO) fail(std::string("read error: ") + std::strerror(errno));
    // Z_BUF_ERROR is a stream that ends early: reported as truncation by the caller.
    if (errnum != Z_OK && errnum != Z_BUF_ERROR) fail(std::string("corrupt gzip data (zlib: ") + message + ")");
  }

  std::string path_;
  GzFile file_;
};

uint32_t big_endian(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

torch::Tensor read_idx_ubyte(const std::string& path, const std::vector<int64_t>& expected_dims,
                             const std::string& what) {
  Reader reader(path);
  const auto ndims = expected_dims.size();
  const uint32_t expected_magic = (uint32_t{kUnsignedByte} << 8) | static_cast<uint32_t>(ndims);

  unsigned char magic_bytes[4];
  const size_t magic_got = reader.read(magic_bytes, 4);
  if (magic_got < 4)
    reader.fail("truncated: file ends inside the IDX header (" + std::to_string(magic_got) + " of 4 magic bytes)");
  const uint32_t magic = big_endian(magic_bytes);
  if (magic != expected_magic)
    reader.fail("bad magic number " + hex32(magic) + ", expected " + hex32(expected_magic) + " (IDX, unsigned bytes, " +
                std::to_string(ndims) + " dimension" + (ndims == 1 ? "" : "s") + "): this is not a file of " + what +
                ", or it is corrupt");

  std::vector<unsigned char> dim_bytes(4 * ndims);
  const size_t dims_got = reader.read(dim_bytes.data(), dim_bytes.size());
  if (dims_got < dim_bytes.size())
    reader.fail("truncated: file ends inside the IDX header (" + std::to_string(4 + dims_got) + " of " +
                std::to_string(4 + dim_bytes.size()) + " header bytes)");
  std::vector<int64_t> dims(ndims);
  bool dims_ok = true;
  for (size_t i = 0; i < ndims; ++i) {
    dims[i] = big_endian(&dim_bytes[4 * i]);
    if (expected_dims[i] >= 0 && dims[i] != expected_dims[i]) dims_ok = false;
  }
  if (!dims_ok)
    reader.fail("header gives dimensions " + join_dims(dims) + ", expected " + join_dims(expected_dims) +
                ": this is not the expected file of " + what + ", or it is corrupt");

  int64_t count = 1;
  for (int64_t d : dims)
    if (__builtin_mul_overflow(count, d, &count) || count > kMaxElements)
      reader.fail("header gives dimensions " + join_dims(dims) + ", more " + what + " than any IDX dataset holds");

  auto data = torch::empty(dims, torch::kUInt8);
  const size_t got = reader.read(data.data_ptr<uint8_t>(), static_cast<size_t>(count));
  if (got < static_cast<size_t>(count))
    reader.fail("truncated: header promises " + std::to_string(count) + " bytes of " + what + ", file has " +
                std::to_string(got) + (reader.stream_cut_short() ? " (the gzip stream ends early)" : ""));

  // Bytes past the promised body mean the header and the data disagree.
  size_t extra = 0;
  unsigned char scratch[1 << 16];
  for (size_t n; (n = reader.read(scratch, sizeof scratch)) > 0;) extra += n;
  if (extra > 0)
    reader.fail("header promises " + std::to_string(count) + " bytes of " + what + ", file has " +
                std::to_string(extra) + " bytes more");
  return data;
}

}  // namespace dtrain::data
