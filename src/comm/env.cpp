#include "comm/env.h"

#include "comm/slurm.h"

#include "dtrain/comm.h"

#include <cstdlib>
#include <stdexcept>

namespace dtrain {

std::optional<std::string> env_string(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

std::optional<int> env_int(const char* name, int min, int max) {
  const auto text = env_string(name);
  if (!text) return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(text->c_str(), &end, 10);
  if (end == text->c_str() || *end != '\0' || value < min || value > max)
    throw CommError(std::string(name) + "='" + *text + "' must be an integer from " + std::to_string(min) + " to " +
                    std::to_string(max));
  return static_cast<int>(value);
}

std::string cuda_backend_from_environment() {
  const auto value = env_string("DTRAIN_CUDA_BACKEND");
  if (!value) return "auto";
  if (*value == "auto" || *value == "nccl" || *value == "gloo") return *value;
  throw std::invalid_argument("DTRAIN_CUDA_BACKEND='" + *value +
                              "' must be auto, nccl or gloo (the c10d engine for CUDA tensors; auto: nccl when "
                              "every local rank has a GPU of its own, else gloo)");
}

std::string backend_from_environment() {
  if (env_string("OMPI_COMM_WORLD_SIZE") || env_string("PMIX_RANK") || env_string("PMI_RANK")) return "mpi";
  const bool rank = env_string("RANK").has_value();
  const bool world = env_string("WORLD_SIZE").has_value();
  if (rank && world) return "c10d";
  if (rank || world)
    throw CommError(std::string("the environment sets ") + (rank ? "RANK but not WORLD_SIZE" : "WORLD_SIZE but not RANK") +
                    ": a torchrun-style launch needs both (or neither, for a single process)");
  // srun without PMI/PMIx (those set PMI_RANK/PMIX_RANK: mpi, above): c10d
  // with the variables comm/slurm.h derives.
  if (in_slurm_step(env_string)) return "c10d";
  return "self";
}

}  // namespace dtrain
