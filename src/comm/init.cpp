// dtrain::init: picks the backend from the flags or from what the launcher
// left in the environment, and applies the per-rank thread budget.
#include "comm/backend.h"
#include "comm/communicator_impl.h"
#include "comm/debug_check.h"
#include "comm/env.h"
#include "comm/slurm.h"

#include <ATen/Parallel.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace dtrain {
namespace {

// Removes --backend VALUE / --backend=VALUE from argv; returns VALUE or "".
std::string take_backend_flag(int& argc, char** argv) {
  std::string value;
  int out = 0;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--backend") == 0) {
      if (i + 1 >= argc) throw CommError("--backend needs a value: mpi or c10d");
      value = argv[++i];
    } else if (std::strncmp(argv[i], "--backend=", 10) == 0) {
      value = argv[i] + 10;
    } else {
      argv[out++] = argv[i];
    }
  }
  argc = out;
  if (argv != nullptr) argv[out] = nullptr;  // keep argv[argc] == nullptr
  return value;
}

// Launchers set DTRAIN_THREADS_PER_RANK so that ranks x threads <= cores.
void apply_thread_budget() {
  if (const auto threads = env_int("DTRAIN_THREADS_PER_RANK", 1, 4096)) at::set_num_threads(*threads);
}

CommPtr make_world(std::string backend, int& argc, char**& argv) {
  if (backend.empty()) backend = backend_from_environment();
  const auto timeout = timeout_from_environment();
  const bool debug = debug_mode_from_environment();
  apply_thread_budget();
  if (backend == "mpi") return make_communicator(make_mpi_world_backend(argc, argv), timeout, debug);
  if (backend == "c10d") {
    export_slurm_variables();  // under srun: RANK, WORLD_SIZE, MASTER_ADDR... from SLURM_*
    return make_communicator(make_c10d_world_backend(timeout), timeout, debug);
  }
  if (backend == "self") return make_communicator(make_self_backend(), timeout, debug);
  throw CommError("unknown backend '" + backend + "': use mpi, c10d or self");
}

}  // namespace

CommPtr init(int& argc, char** argv) {
  const std::string backend = take_backend_flag(argc, argv);
  return make_world(backend, argc, argv);
}

CommPtr init(const InitOptions& options) {
  int argc = 0;
  char** argv = nullptr;
  return make_world(options.backend, argc, argv);
}

}  // namespace dtrain
