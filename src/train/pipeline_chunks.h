// --schedule interleaved: a pipeline rank's chunks as one model
// (src/train/pipeline_chunks.cpp).
#pragma once

#include "dtrain/model_spec.h"
#include "dtrain/train.h"

#include <functional>

namespace dtrain::train {

struct PipelineChunks {
  // The chunks merged: its module holds every chunk's under the whole
  // model's names; its forward runs the selected chunk.
  BuiltModel model;
  // Selects the chunk the next forward runs (0 .. virtual_stages - 1).
  std::function<void(int chunk)> select;
};

// Calls spec.pipeline_stage once per chunk of this rank (config.virtual_stages
// of them, pipeline_place naming each) from the default generator's present
// state each (Note [chunk weights]). Throws std::invalid_argument naming the
// spec when two chunks hold the same name.
PipelineChunks build_chunks(const TrainConfig& config, const DeviceMesh& mesh, const ModelSpec& spec);

}  // namespace dtrain::train
