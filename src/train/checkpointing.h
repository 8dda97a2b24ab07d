// Checkpoints of a training run (dtrain train --checkpoint-dir): where they
// live, which one to resume from, which ones to keep, and the per-rank random
// state they carry so that a resumed run continues bitwise.
//
// Layout: DIR/step-00000100/ holds the sharded checkpoint of step 100 (see
// include/dtrain/checkpoint.h). A save in progress lives in
// DIR/step-00000100.tmp-100 until it is complete; anything without a
// complete manifest and matching checksums is never resumed from.
#pragma once

#include "dtrain/checkpoint.h"
#include "dtrain/comm.h"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::train {

// DIR/step-NNNNNNNN (eight digits, so names sort by step).
std::string checkpoint_path(const std::string& dir, int64_t step);

// The steps of the checkpoints in `dir` worth trying to resume from, newest
// first (checkpoint_path names their directories): their
// manifest is complete and their files have the sizes it records. Those that
// fail are described in `rejected` ("step-00000300: rank-00001-of-00002.safetensors:
// 1000 bytes, the manifest says 2000"). Checksums are left to the load, which
// verifies them across the ranks in parallel. Single process (rank 0 looks).
std::vector<int64_t> resumable_checkpoints(const std::string& dir, std::vector<std::string>& rejected);

// Removes all but the newest `keep_last` complete checkpoints in `dir`
// (keep_last 0: keep all) and any unfinished save older than the newest one.
// Single process; errors are ignored (a leftover directory is never loaded).
void prune_checkpoints(const std::string& dir, int64_t keep_last);

// How a run writes and reads one checkpoint directory (collective): a
// Strategy with its optimizer, or an engine's own (the parameter server's
// servers and workers, src/train/ps_checkpoint.h).
using SaveCheckpoint =
    std::function<void(const std::string& path, int64_t step, const std::map<std::string, std::string>& extra)>;
using LoadCheckpoint = std::function<CheckpointManifest(const std::string& path)>;

// Collective. Saves step `step` to checkpoint_path(dir, step) with `extra`
// and every rank's random state, then rank 0 keeps the newest `keep_last`.
// Throws std::runtime_error on every rank when any rank cannot write; the
// checkpoints already in `dir` are then untouched.
void save_training_checkpoint(const std::string& dir, int64_t step, int64_t keep_last, const SaveCheckpoint& save,
                              const CommPtr& world, std::map<std::string, std::string> extra);

// Collective: `extra` with every rank's random state added (what a
// checkpoint carries so that a resumed run continues bitwise).
std::map<std::string, std::string> with_random_states(std::map<std::string, std::string> extra, const CommPtr& world);

// Collective. Loads the newest valid checkpoint in `dir` (rank 0 lists the
// candidates, every rank tries the same ones in turn; one whose checksums do
// not match is passed over) through `load`, and restores
// this rank's random state when the checkpoint has the same world size.
// Returns its manifest, or nullopt when `dir` holds none; throws
// std::runtime_error on every rank when it holds some but none loads.
// `rejected` (rank 0) gets the newer directories passed over and why.
std::optional<CheckpointManifest> resume_from_latest(const std::string& dir, const LoadCheckpoint& load,
                                                     const CommPtr& world, std::vector<std::string>* rejected);

// The CPU generator's state (dropout masks, ...) as hex text, and back.
std::string cpu_rng_state();
void set_cpu_rng_state(const std::string& hex);

}  // namespace dtrain::train
