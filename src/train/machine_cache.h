// Measurements of this machine cached between runs (the GEMM probe's peak,
// the memory bandwidth): one JSON object per file, keyed by what the
// measurement depends on.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <filesystem>
#include <string>

namespace dtrain::train {

// $DTRAIN_CACHE_DIR/NAME, else $XDG_CACHE_HOME/dtrain/NAME, else
// ~/.cache/dtrain/NAME; empty where none is set.
std::filesystem::path machine_cache_file(const std::string& name);
// The file's object ({} where it is missing or not an object).
nlohmann::json read_machine_cache(const std::filesystem::path& file);
// Best-effort: a cache that cannot be written costs a probe next time.
// Written to a private file and renamed, so concurrent runs never see half.
void write_machine_cache(const std::filesystem::path& file, const nlohmann::json& cached);
// The CPU's model name (/proc/cpuinfo), part of a CPU measurement's key.
std::string cpu_model();

}  // namespace dtrain::train
