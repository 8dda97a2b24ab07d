// libFuzzer target for the safetensors header parser (`make fuzz`; see the
// Makefile). Any input must either parse or throw FormatError; a parsed file
// must keep every promise of Note [safetensors layout] (checked here byte by
// byte, so AddressSanitizer sees a range outside the input), and writing its
// header back and parsing that again must give the same tensors.
#include "checkpoint/safetensors_format.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace st = dtrain::safetensors;

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

bool same_entries(const st::Header& a, const st::Header& b) {
  if (a.tensors.size() != b.tensors.size() || a.metadata != b.metadata || a.data_size != b.data_size) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.begin != y.begin || x.end != y.end)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  st::Header header;
  try {
    header = st::parse_safetensors_header(data, size);
  } catch (const st::FormatError&) {
    return 0;
  }
  check(header.data_offset + header.data_size == size);
  uint64_t covered = 0;
  unsigned checksum = 0;
  for (const auto& t : header.tensors) {
    check(t.begin <= t.end && t.end <= header.data_size);
    check(t.nbytes() == t.numel() * st::dtype_size(t.dtype));
    for (int64_t dim : t.shape) check(dim >= 0);
    // Read every byte the header promises, as a loader would copy them.
    for (uint64_t i = t.begin; i < t.end; ++i) checksum += data[header.data_offset + i];
    covered += t.nbytes();
  }
  check(covered == header.data_size);

  const std::string rewritten = st::serialize_header(header.tensors, header.metadata);
  std::string file = rewritten;
  file.append(reinterpret_cast<const char*>(data + header.data_offset), header.data_size);
  const st::Header again = st::parse_safetensors_header(reinterpret_cast<const uint8_t*>(file.data()), file.size());
  check(same_entries(header, again));
  check(again.data_offset % 8 == 0);
  return static_cast<int>(checksum & 0);
}
