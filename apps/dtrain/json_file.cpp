#include "json_file.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>

namespace dtrain::cli {

bool write_json_file(const std::string& path, const nlohmann::json& document) {
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial);
    out << document.dump(2) << "\n";
    if (!out) {
      std::remove(partial.c_str());
      return false;
    }
  }
  if (std::rename(partial.c_str(), path.c_str()) == 0) return true;
  std::remove(partial.c_str());
  return false;
}

}  // namespace dtrain::cli
