// The two halves of a sharded save (include/dtrain/checkpoint.h), apart so
// that --checkpoint-async can run the second on another thread: what this
// rank writes (views of the model and optimizer, to be copied before
// training changes them), and the protocol that writes and publishes it
// (temporary directory, fsync, every rank agreeing, manifest last, one
// atomic rename). save_checkpoint runs both in a row; async_save.h stages
// the first into host memory and runs the second on its writer thread.
#pragma once

#include "checkpoint/held_state.h"

#include <dtrain/checkpoint.h>
#include <dtrain/comm.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::detail {

// This rank's file: the part of each held piece it writes (a 1/replicas
// share of replicated pieces), and the matching optimizer state.
struct RankFile {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  CheckpointManifest::File record;
  std::map<std::string, CheckpointManifest::Tensor> tensor_table;
};

// Not collective. The tensors are views of `held` and the optimizer state.
RankFile rank_file_of(const HeldModel& held, torch::optim::Optimizer* optimizer);

// What the manifest says besides the files.
struct SaveRequest {
  std::string dir;
  int64_t step = 0;
  int rank = 0, world_size = 1;
  std::string strategy;
  std::string optimizer_kind;  // "adamw", "sgd", "none", ...
  std::map<std::string, std::string> extra;
};

// Collective over `comm` (null: one process): writes `file` into
// DIR.tmp-STEP, agrees that every rank wrote, and rank 0 writes the manifest
// and renames the directory to DIR. `error` is a failure this rank already
// had (building its file); it fails the save on every rank, as any later
// one does (std::runtime_error, the temporary directory removed).
void write_checkpoint(const SaveRequest& request, const RankFile& file, std::string error, const CommPtr& comm);

}  // namespace dtrain::detail
