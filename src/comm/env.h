// Validated reads of the environment variables dtrain and its launchers use.
// A bad value is an error naming the variable (a CommError; for a choice
// among names, std::invalid_argument), never a silent default.
#pragma once

#include <optional>
#include <string>

namespace dtrain {

// The value, or nullopt when unset or empty.
std::optional<std::string> env_string(const char* name);
// An integer in [min, max]; nullopt when unset.
std::optional<int> env_int(const char* name, int min, int max);

// DTRAIN_CUDA_BACKEND, the c10d engine for CUDA tensors: "auto" (also when
// unset), "nccl" or "gloo". Anything else throws std::invalid_argument
// naming the variable and the choices.
std::string cuda_backend_from_environment();

}  // namespace dtrain
