// Validated reads of the environment variables dtrain and its launchers use.
// A bad value is a CommError naming the variable, never a silent default.
#pragma once

#include <optional>
#include <string>

namespace dtrain {

// The value, or nullopt when unset or empty.
std::optional<std::string> env_string(const char* name);
// An integer in [min, max]; nullopt when unset.
std::optional<int> env_int(const char* name, int min, int max);

}  // namespace dtrain
