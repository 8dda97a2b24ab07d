#include "checkpoint/manifest.h"

#include "checkpoint/optimizer_state_names.h"

#include <dtrain/strategy_table.h>

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace dtrain {
namespace detail {

using nlohmann::json;

std::string rank_file_name(int rank, int world_size) {
  char name[64];
  std::snprintf(name, sizeof(name), "rank-%05d-of-%05d.safetensors", rank, world_size);
  return name;
}

uint64_t file_xxh64(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!file) throw std::runtime_error(path + ": cannot open for reading");
  std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> state(XXH64_createState(), XXH64_freeState);
  XXH64_reset(state.get(), 0);
  std::vector<char> buffer(1 << 20);
  size_t got = 0;
  while ((got = std::fread(buffer.data(), 1, buffer.size(), file.get())) > 0) XXH64_update(state.get(), buffer.data(), got);
  if (std::ferror(file.get())) throw std::runtime_error(path + ": read error");
  return XXH64_digest(state.get());
}

int64_t file_bytes(const std::string& path) {
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  if (error) throw std::runtime_error(path + ": " + error.message());
  return static_cast<int64_t>(size);
}

namespace {

// A manifest's integers must be JSON integers that fit: nlohmann's
// get<int64_t>() converts 1e300 or 2^64-1 with undefined behaviour (found by
// make fuzz).
int64_t integer(const json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t value = j.get<uint64_t>();
    if (value > static_cast<uint64_t>(INT64_MAX)) throw std::runtime_error("integer " + std::to_string(value) + " is too large");
    return static_cast<int64_t>(value);
  }
  if (!j.is_number_integer()) throw std::runtime_error(std::string("expected an integer, found ") + j.type_name());
  return j.get<int64_t>();
}

int small_integer(const json& j) {
  const int64_t value = integer(j);
  if (value < INT32_MIN || value > INT32_MAX) throw std::runtime_error("integer " + std::to_string(value) + " is too large");
  return static_cast<int>(value);
}

std::vector<int64_t> integers(const json& j) {
  if (!j.is_array()) throw std::runtime_error(std::string("expected a list of integers, found ") + j.type_name());
  std::vector<int64_t> values;
  for (const auto& item : j) values.push_back(integer(item));
  return values;
}

std::string hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

uint64_t from_hex(const std::string& text) {
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos) {
    throw std::runtime_error("xxh64 '" + text + "' is not 16 hex digits");
  }
  return std::stoull(text, nullptr, 16);
}

json file_json(const CheckpointManifest::File& file) {
  json pieces = json::array();
  for (const auto& piece : file.pieces) {
    // [name, begin, end]; a strided piece, or one after another of its tensor
    // in the same file, adds [.., offset, stride, count].
    if (piece.offset == 0 && piece.count == 1) {
      pieces.push_back({piece.name, piece.begin, piece.end});
    } else {
      pieces.push_back({piece.name, piece.begin, piece.end, piece.offset, piece.stride, piece.count});
    }
  }
  return {{"name", file.name}, {"bytes", file.bytes}, {"xxh64", hex(file.xxh64)}, {"pieces", pieces}};
}

CheckpointManifest::File file_from(const json& j) {
  CheckpointManifest::File file;
  file.name = j.at("name").get<std::string>();
  if (file.name.empty() || file.name.find('/') != std::string::npos || file.name[0] == '.') {
    throw std::runtime_error("file name '" + file.name + "' is not a plain file name");
  }
  file.bytes = integer(j.at("bytes"));
  file.xxh64 = from_hex(j.at("xxh64").get<std::string>());
  for (const auto& piece : j.at("pieces")) {
    if (!piece.is_array() || (piece.size() != 3 && piece.size() != 6)) {
      throw std::runtime_error("a piece is [name, begin, end] or [name, begin, end, offset, stride, count]");
    }
    CheckpointManifest::Piece p{piece.at(0).get<std::string>(), integer(piece.at(1)), integer(piece.at(2))};
    if (piece.size() == 6) {
      p.offset = integer(piece.at(3));
      p.stride = integer(piece.at(4));
      p.count = integer(piece.at(5));
    }
    if (p.begin < 0 || p.end < p.begin) throw std::runtime_error("piece of '" + p.name + "' has a bad range");
    // Runs that stay apart (stride >= length), counted in elements that fit.
    int64_t span = 0, elements = 0;
    if (p.offset < 0 || p.count < 1 || (p.count > 1 && p.stride < p.end - p.begin) || (p.count == 1 && p.stride != 0) ||
        __builtin_mul_overflow(p.count - 1, p.stride, &span) || __builtin_add_overflow(span, p.end, &span) ||
        __builtin_mul_overflow(p.count, p.end - p.begin, &elements) ||
        __builtin_add_overflow(p.offset, elements, &elements)) {
      throw std::runtime_error("piece of '" + p.name + "' has a bad offset, stride or count");
    }
    file.pieces.push_back(std::move(p));
  }
  return file;
}

json tensor_json(const CheckpointManifest::Tensor& tensor) { return {{"dtype", tensor.dtype}, {"shape", tensor.shape}}; }

CheckpointManifest::Tensor tensor_from(const json& j) {
  CheckpointManifest::Tensor tensor{j.at("dtype").get<std::string>(), integers(j.at("shape"))};
  for (int64_t d : tensor.shape) {
    if (d < 0) throw std::runtime_error("negative dimension");
  }
  return tensor;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) throw std::runtime_error("a tensor's shape has more elements than fit in 64 bits");
  }
  return n;
}

// The most contiguous ranges one tensor's pieces may list: a row-parallel
// weight's pieces list one per row and rank (a 16384-row weight at tp 8 has
// 131072), and a hostile manifest of a few bytes must not make the check
// below expand 2^60 of them (64 MiB of ranges at most).
constexpr int64_t kMostRangesPerTensor = int64_t{1} << 22;

// Every tensor's elements, overflow-checked, and its pieces over all files
// covering [0, numel) exactly once: an overlap or a gap would hand the model
// elements nobody wrote (issue 16). And within each file, the pieces of a
// tensor lie one after another in its entry (offsets 0, n1, n1 + n2, ...).
// Checked before anything is allocated.
void check_pieces_cover_tensors(const CheckpointManifest& manifest) {
  std::map<std::string, std::vector<const CheckpointManifest::Piece*>> by_tensor;
  for (const auto& [name, tensor] : manifest.tensors) by_tensor[name];
  for (const auto& file : manifest.files) {
    for (const auto& piece : file.pieces) {
      auto it = by_tensor.find(piece.name);
      if (it == by_tensor.end()) throw std::runtime_error(file.name + " holds unknown tensor '" + piece.name + "'");
      if (piece.begin < piece.end) it->second.push_back(&piece);
    }
  }
  for (auto& [name, listed] : by_tensor) {
    const int64_t numel = numel_of(manifest.tensors.at(name).shape);
    int64_t listed_ranges = 0;
    for (const auto* piece : listed) {
      if (piece->count > kMostRangesPerTensor - listed_ranges) {
        throw std::runtime_error("the pieces of '" + name + "' list more than " + std::to_string(kMostRangesPerTensor) +
                                 " ranges");
      }
      listed_ranges += piece->count;
    }
    std::vector<std::pair<int64_t, int64_t>> pieces;
    pieces.reserve(static_cast<size_t>(listed_ranges));
    for (const auto* piece : listed) {
      for (int64_t k = 0; k < piece->count; ++k) {
        const int64_t first = piece->begin + k * piece->stride;  // no overflow: checked when parsing
        pieces.emplace_back(first, first + piece->end - piece->begin);
      }
    }
    std::sort(pieces.begin(), pieces.end());
    int64_t covered = 0;
    for (const auto& [begin, end] : pieces) {
      if (begin < covered) {
        throw std::runtime_error("elements [" + std::to_string(begin) + ", " + std::to_string(std::min(end, covered)) +
                                 ") of '" + name + "' are in more than one piece");
      }
      if (begin > covered) {
        throw std::runtime_error("elements [" + std::to_string(covered) + ", " + std::to_string(begin) + ") of '" +
                                 name + "' are in no piece");
      }
      covered = end;
    }
    if (covered > numel) throw std::runtime_error("pieces of '" + name + "' run beyond its " + std::to_string(numel) + " elements");
    if (covered < numel) {
      throw std::runtime_error("elements [" + std::to_string(covered) + ", " + std::to_string(numel) + ") of '" + name +
                               "' are in no piece");
    }
  }
  for (const auto& file : manifest.files) {
    std::map<std::string, int64_t> entry_end;  // of each tensor's pieces so far in this file
    for (const auto& piece : file.pieces) {
      if (piece.begin == piece.end) continue;
      int64_t& end = entry_end[piece.name];
      if (piece.offset != end) {
        throw std::runtime_error(file.name + ": a piece of '" + piece.name + "' starts at element " +
                                 std::to_string(piece.offset) + " of its entry, not " + std::to_string(end) +
                                 " where the one before it ends");
      }
      end += piece.numel();  // no overflow: offset + numel was checked when parsing
    }
  }
}

// The fields a saver writes together agree with each other: rank i's file
// is named for rank i of world_size, the strategy is one a saver writes (a
// one-rank strategy at world size 1), and optimizer state is listed only for
// a known optimizer, only for tensors the manifest lists, and only under the
// keys that optimizer keeps (checkpoint/optimizer_state_names.h).
void check_fields_agree(const CheckpointManifest& manifest) {
  for (size_t i = 0; i < manifest.files.size(); ++i) {
    const std::string expected = rank_file_name(static_cast<int>(i), manifest.world_size);
    if (manifest.files[i].name != expected) {
      throw std::runtime_error("file " + std::to_string(i) + " is named '" + manifest.files[i].name + "', not '" +
                               expected + "' as a save at world size " + std::to_string(manifest.world_size) +
                               " names it");
    }
  }
  // A row of the strategy table, by name or alias (manifests before the
  // table said "full", "gradop", "optimizer", "hybrid", "none").
  const StrategyInfo* strategy = find_strategy(manifest.strategy);
  if (!strategy) throw std::runtime_error("unknown strategy '" + manifest.strategy + "'");
  if (!strategy->multi_rank && manifest.world_size != 1) {
    throw std::runtime_error("strategy '" + manifest.strategy + "' at world size " + std::to_string(manifest.world_size));
  }
  if (manifest.step < 0) throw std::runtime_error("negative step " + std::to_string(manifest.step));
  if (!known_optimizer_kind(manifest.optimizer)) throw std::runtime_error("unknown optimizer '" + manifest.optimizer + "'");
  const auto keys = optimizer_state_keys(manifest.optimizer);
  const std::string prefix = kOptimizerStatePrefix;
  for (const auto& [name, tensor] : manifest.tensors) {
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t slash = name.rfind('/');
    const std::string parameter = name.substr(prefix.size(), slash - prefix.size()), key = name.substr(slash + 1);
    if (slash < prefix.size() || std::find(keys.begin(), keys.end(), key) == keys.end()) {
      throw std::runtime_error("'" + name + "' is no " + manifest.optimizer + " state");
    }
    auto owner = manifest.tensors.find(parameter);
    if (owner == manifest.tensors.end()) throw std::runtime_error("'" + name + "' is state of a tensor it does not list");
    // The step counter is one int64; every other field has its parameter's shape and dtype.
    const bool matches = key == "step" ? tensor.dtype == "int64" && numel_of(tensor.shape) == 1
                                       : tensor.shape == owner->second.shape && tensor.dtype == owner->second.dtype;
    if (!matches) throw std::runtime_error("'" + name + "' has another shape or dtype than " + key + " of '" + parameter + "' must have");
  }
}

}  // namespace

std::string file_record_to_json(const CheckpointManifest::File& file,
                                const std::map<std::string, CheckpointManifest::Tensor>& tensors) {
  json record = file_json(file);
  json table = json::object();
  for (const auto& [name, tensor] : tensors) table[name] = tensor_json(tensor);
  record["tensors"] = table;
  return record.dump();
}

CheckpointManifest::File file_record_from_json(const std::string& text,
                                               std::map<std::string, CheckpointManifest::Tensor>& tensors) {
  const json record = json::parse(text);
  for (const auto& [name, value] : record.at("tensors").items()) {
    auto tensor = tensor_from(value);
    auto [it, fresh] = tensors.emplace(name, tensor);
    if (!fresh && (it->second.dtype != tensor.dtype || it->second.shape != tensor.shape)) {
      throw std::runtime_error("ranks disagree on the dtype or shape of '" + name + "'");
    }
  }
  return file_from(record);
}

std::string manifest_to_json(const CheckpointManifest& manifest) {
  json tensors = json::object();
  for (const auto& [name, tensor] : manifest.tensors) tensors[name] = tensor_json(tensor);
  json files = json::array();
  for (const auto& file : manifest.files) files.push_back(file_json(file));
  json j = {{"format", "dtrain-sharded-checkpoint"},
            {"format_version", manifest.format_version},
            {"step", manifest.step},
            {"world_size", manifest.world_size},
            {"strategy", manifest.strategy},
            {"optimizer", manifest.optimizer},
            {"extra", manifest.extra},
            {"tensors", tensors},
            {"files", files}};
  return j.dump(1) + "\n";
}

CheckpointManifest manifest_from_json(const std::string& text, const std::string& where) {
  try {
    const json j = json::parse(text);
    if (j.at("format").get<std::string>() != "dtrain-sharded-checkpoint") throw std::runtime_error("not a dtrain checkpoint");
    CheckpointManifest manifest;
    manifest.format_version = small_integer(j.at("format_version"));
    if (manifest.format_version < 1 || manifest.format_version > kCheckpointFormatVersion) {
      throw std::runtime_error("format version " + std::to_string(manifest.format_version) + ", this dtrain reads 1 to " +
                               std::to_string(kCheckpointFormatVersion));
    }
    manifest.step = integer(j.at("step"));
    manifest.world_size = small_integer(j.at("world_size"));
    manifest.strategy = j.at("strategy").get<std::string>();
    manifest.optimizer = j.at("optimizer").get<std::string>();
    manifest.extra = j.at("extra").get<std::map<std::string, std::string>>();
    for (const auto& [name, value] : j.at("tensors").items()) manifest.tensors[name] = tensor_from(value);
    for (const auto& file : j.at("files")) manifest.files.push_back(file_from(file));
    if (manifest.world_size < 1 || static_cast<int>(manifest.files.size()) != manifest.world_size) {
      throw std::runtime_error("lists " + std::to_string(manifest.files.size()) + " files for world size " +
                               std::to_string(manifest.world_size));
    }
    check_fields_agree(manifest);
    check_pieces_cover_tensors(manifest);
    return manifest;
  } catch (const std::exception& error) {
    throw std::runtime_error(where + ": not a complete checkpoint manifest (" + error.what() +
                             "); the save that wrote it did not finish, or the file was damaged");
  }
}

}  // namespace detail

CheckpointManifest read_checkpoint_manifest(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / detail::kManifestName).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error(dir + ": no " + std::string(detail::kManifestName) +
                             ", so this is not a complete checkpoint (an interrupted save leaves none); pass the "
                             "directory of a finished checkpoint");
  }
  std::stringstream text;
  text << in.rdbuf();
  return detail::manifest_from_json(text.str(), path);
}

}  // namespace dtrain
