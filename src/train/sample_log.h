// Which samples each rank trained on, step by step (testing only).
//
// DTRAIN_TEST_SAMPLE_LOG=PATH (testing only): every rank of a data-parallel
// run (single, ddp and the sharded strategies) appends one line per training
// step to PATH, a JSON object
//   {"attempt":A,"world":W,"rank":R,"step":S,"dataset_size":N,
//    "global_batch":B,"indices":[...]}
// with A = restart_count_from_environment() (train/restarts.h), S the
// sampler's step (from 0: the step that the progress line and the metrics
// call S + 1), and the indices this rank's local batch of that step, in order.
// The file is opened once with O_APPEND and each line written with one
// write(), so the lines of ranks sharing the file do not interleave. The
// elastic test (tests/train/check_elastic_samples.py) reads it with
// tests/train/check_samples.py to prove that a job resized through a
// checkpoint sees every sample of an epoch exactly once. Nothing is written,
// and nothing but one cached check is done, when it is unset.
#pragma once

#include <cstdint>
#include <vector>

namespace dtrain::train {

// Appends step `step`'s record for this rank when DTRAIN_TEST_SAMPLE_LOG is set.
void log_samples(int world, int rank, int64_t step, int64_t dataset_size, int64_t global_batch,
                 const std::vector<int64_t>& indices);

}  // namespace dtrain::train
