// A stand-in for a group of ranks inside one process: a communicator that
// acts as rank `rank` of `size` ranks, for running a model split across a
// group (tensor parallelism) with its real shapes where the other ranks do
// not exist, as `dtrain plan` does to measure one rank's activations.
//
// Its collectives give every tensor the shape the real group gives it and
// move only this rank's data: an all-reduce leaves the tensor as it is, an
// all-gather puts this rank's piece in its place and zeros elsewhere, a
// reduce-scatter keeps this rank's piece of the input. So the values are not
// the group's, only the shapes and the memory. Point-to-point and split()
// throw CommError: there are no peers.
#pragma once

#include <dtrain/comm.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace dtrain {

// What a stand-in group was asked to move: for each operation
// ("all_reduce", "all_gather", "reduce_scatter", "all_to_all",
// "broadcast"), the calls and their payload bytes as dtrain::plan counts
// them (the whole tensor of an all-reduce, the full side of an all-gather or
// reduce-scatter; a bf16 reduction arrives widened to fp32 and counts at fp32's
// size). The communicator runs one operation at a time, so read it after the
// operations' Work completed.
struct StandInTraffic {
  struct Operation {
    int64_t calls = 0;
    int64_t payload_bytes = 0;
  };
  std::map<std::string, Operation> operations;
};

// Throws std::invalid_argument unless 0 <= rank < size.
CommPtr stand_in_group(int size, int rank, std::shared_ptr<StandInTraffic> traffic = nullptr);

}  // namespace dtrain
