#include "train/machine_cache.h"

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>

namespace dtrain::train {
namespace fs = std::filesystem;

fs::path machine_cache_file(const std::string& name) {
  if (const char* dir = std::getenv("DTRAIN_CACHE_DIR"); dir && *dir) return fs::path(dir) / name;
  if (const char* dir = std::getenv("XDG_CACHE_HOME"); dir && *dir) return fs::path(dir) / "dtrain" / name;
  if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "dtrain" / name;
  return {};
}

nlohmann::json read_machine_cache(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return nlohmann::json::object();
  auto cached = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return cached.is_object() ? cached : nlohmann::json::object();
}

void write_machine_cache(const fs::path& file, const nlohmann::json& cached) {
  std::error_code error;
  fs::create_directories(file.parent_path(), error);
  const fs::path temporary = file.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary);
    if (!(out << cached.dump(2) << '\n')) return;
  }
  fs::rename(temporary, file, error);
  if (error) fs::remove(temporary, error);
}

std::string cpu_model() {
  std::ifstream info("/proc/cpuinfo");
  for (std::string line; std::getline(info, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "cpu";
}

}  // namespace dtrain::train
