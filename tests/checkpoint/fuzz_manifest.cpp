// libFuzzer target for the checkpoint manifest parser (`make fuzz`; see the
// Makefile). Any input must either parse or throw std::runtime_error; a
// parsed manifest must keep the promises load_checkpoint relies on (one file
// per rank, every piece inside a known tensor), and writing it back and
// parsing that again must give the same manifest.
#include "checkpoint/manifest.h"

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace {

void check(bool condition) {
  if (!condition) std::abort();
}

bool same(const dtrain::CheckpointManifest& a, const dtrain::CheckpointManifest& b) {
  if (a.step != b.step || a.world_size != b.world_size || a.strategy != b.strategy || a.optimizer != b.optimizer ||
      a.extra != b.extra || a.tensors.size() != b.tensors.size() || a.files.size() != b.files.size())
    return false;
  for (const auto& [name, tensor] : a.tensors) {
    auto other = b.tensors.find(name);
    if (other == b.tensors.end() || other->second.dtype != tensor.dtype || other->second.shape != tensor.shape) return false;
  }
  for (size_t i = 0; i < a.files.size(); ++i) {
    const auto &x = a.files[i], &y = b.files[i];
    if (x.name != y.name || x.bytes != y.bytes || x.xxh64 != y.xxh64 || x.pieces.size() != y.pieces.size()) return false;
    for (size_t k = 0; k < x.pieces.size(); ++k)
      if (x.pieces[k].name != y.pieces[k].name || x.pieces[k].begin != y.pieces[k].begin || x.pieces[k].end != y.pieces[k].end)
        return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  dtrain::CheckpointManifest manifest;
  try {
    manifest = dtrain::detail::manifest_from_json(text, "fuzz");
  } catch (const std::runtime_error&) {
    return 0;
  }
  check(manifest.world_size >= 1 && manifest.files.size() == static_cast<size_t>(manifest.world_size));
  for (const auto& file : manifest.files) {
    check(!file.name.empty() && file.name.find('/') == std::string::npos && file.name[0] != '.');
    for (const auto& piece : file.pieces) {
      check(manifest.tensors.count(piece.name) == 1);
      check(0 <= piece.begin && piece.begin <= piece.end);
    }
  }
  const auto again = dtrain::detail::manifest_from_json(dtrain::detail::manifest_to_json(manifest), "round trip");
  check(same(manifest, again));
  // A rank's file record (what ranks send rank 0 while saving) goes through the same checks.
  std::map<std::string, dtrain::CheckpointManifest::Tensor> tensors;
  try {
    (void)dtrain::detail::file_record_from_json(text, tensors);
  } catch (const std::exception&) {
  }
  return 0;
}
