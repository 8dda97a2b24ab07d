// plan::interleave_stages (include/dtrain/plan.h): a rank's interleaved
// chunks as one description, their units merged as the trainer merges the
// chunks' modules by name (src/train/pipeline_chunks.cpp). FSDP's units follow
// the merged module's order: a container two chunks hold ("blocks") is one
// module, so a later chunk's blocks join the earlier chunk's there, and
// anything else the later chunk brings (the last stage's tied head) comes
// after them.
#include "dtrain/plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace dtrain::plan {
namespace {

// The container a unit's module sits in: "blocks" for "blocks.3"; "" for a
// child of the root.
std::string container_of(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

// "(blocks 2-3)" of a stage's description, or "".
std::string blocks_of(const std::string& description) {
  const auto open = description.find("(blocks ");
  if (open == std::string::npos) return "";
  const auto close = description.find(')', open);
  return description.substr(open + 8, close - open - 8);
}

}  // namespace

ModelSpec interleave_stages(std::vector<ModelSpec> chunks, int rank, int ranks) {
  const int V = static_cast<int>(chunks.size());
  if (V < 2)
    throw std::invalid_argument("plan: an interleaved rank holds at least 2 chunks, got " + std::to_string(V));
  if (ranks < 2 || rank < 0 || rank >= ranks)
    throw std::invalid_argument("plan: rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                                " pipeline ranks (at least 2)");
  for (int k = 0; k < V; ++k) {
    const auto& stage = chunks[static_cast<size_t>(k)].pipeline;
    if (stage.stage != rank + k * ranks || stage.stages != ranks * V ||
        stage.microbatches != chunks.front().pipeline.microbatches)
      throw std::invalid_argument("plan: chunk " + std::to_string(k) + " of rank " + std::to_string(rank) +
                                  " must be stage " + std::to_string(rank + k * ranks) + " of " +
                                  std::to_string(ranks * V) + " at " +
                                  std::to_string(chunks.front().pipeline.microbatches) + " microbatches, got stage " +
                                  std::to_string(stage.stage) + " of " + std::to_string(stage.stages) + " at " +
                                  std::to_string(stage.microbatches));
  }
  const ModelSpec& first = chunks.front();
  ModelSpec merged;
  const auto stage_at = first.description.find(", pipeline stage ");
  merged.description = first.description.substr(0, stage_at) + ", pipeline rank " + std::to_string(rank) + " of " +
                       std::to_string(ranks) + " interleaved: stages";
  std::string blocks;
  for (int k = 0; k < V; ++k) {
    merged.description += (k ? ", " : " ") + std::to_string(rank + k * ranks);
    const std::string own = blocks_of(chunks[static_cast<size_t>(k)].description);
    if (!own.empty()) blocks += (blocks.empty() ? "" : ", ") + own;
  }
  merged.description += " of " + std::to_string(ranks * V) + (blocks.empty() ? "" : " (blocks " + blocks + ")") + ", " +
                        std::to_string(first.pipeline.microbatches) + " microbatches of " +
                        std::to_string(first.batch_per_rank / first.pipeline.microbatches);
  merged.batch_per_rank = first.batch_per_rank;
  merged.input_bytes = first.input_bytes;  // the part's tokens and targets, loaded once
  merged.tensor_parallel = first.tensor_parallel;

  merged.units.push_back(UnitSpec{});  // the root: every chunk's root parameters
  std::string tied_name;
  for (const ModelSpec& chunk : chunks) {
    merged.buffer_bytes += chunk.buffer_bytes;
    const auto& root = chunk.units.front().parameters;
    merged.units.front().parameters.insert(merged.units.front().parameters.end(), root.begin(), root.end());
    if (chunk.pipeline.tied_unit) tied_name = chunk.units[chunk.pipeline.tied_unit_at].name;
    for (size_t u = 1; u < chunk.units.size(); ++u) {
      const UnitSpec& unit = chunk.units[u];
      const bool held = std::any_of(merged.units.begin(), merged.units.end(),
                                    [&](const UnitSpec& m) { return m.name == unit.name; });
      if (held)
        throw std::invalid_argument("plan: two chunks of rank " + std::to_string(rank) + " hold unit '" + unit.name +
                                    "'");
      // After the last unit of its container, if an earlier chunk filled it.
      auto at = merged.units.end();
      const std::string container = container_of(unit.name);
      if (!container.empty())
        for (auto it = merged.units.begin() + 1; it != merged.units.end(); ++it)
          if (container_of(it->name) == container) at = it + 1;
      merged.units.insert(at, unit);
    }
    // Collectives of one kind over one group, summed over the chunks.
    for (const Collective& c : chunk.collectives) {
      auto same = std::find_if(merged.collectives.begin(), merged.collectives.end(), [&](const Collective& m) {
        return std::tie(m.op, m.what, m.group_size) == std::tie(c.op, c.what, c.group_size);
      });
      if (same == merged.collectives.end()) {
        merged.collectives.push_back(c);
      } else {
        same->calls += c.calls;
        same->payload_bytes += c.payload_bytes;
      }
    }
  }
  merged.pipeline.stage = rank;
  merged.pipeline.stages = ranks;
  merged.pipeline.microbatches = first.pipeline.microbatches;
  merged.pipeline.message_bytes = first.pipeline.message_bytes;
  if (!tied_name.empty()) {
    merged.pipeline.tied_unit = true;
    for (size_t u = 1; u < merged.units.size(); ++u)
      if (merged.units[u].name == tied_name) merged.pipeline.tied_unit_at = u;
  }
  merged.chunks = std::move(chunks);
  return merged;
}

}  // namespace dtrain::plan
