// Result files of `dtrain bench`: written whole or not at all.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace dtrain::cli {

// Writes DOCUMENT (indented) beside PATH and renames it into place, so a
// reader never sees half a file. False, with nothing left behind, when it
// cannot be written.
bool write_json_file(const std::string& path, const nlohmann::json& document);

}  // namespace dtrain::cli
