// A device mesh: the world's ranks arranged as an N-dimensional grid with
// named dimensions, e.g. (dp, tp) for FSDP over tensor parallelism, and one
// communicator per dimension (the ranks that differ only in that coordinate).
//
// Layout is row-major with the last dimension innermost:
//   rank = ((c0 * s1) + c1) * s2 + c2 ...   for coordinates c and sizes s.
// So with (dp, tp) the ranks of one tensor-parallel group are consecutive,
// which a launcher places on one host (`--hosts h1:4,h2:4` with tp = 4), where
// the all-reduces on every layer's critical path are cheapest; the
// data-parallel groups stride across hosts.
//
//   auto world = dtrain::init(argc, argv);
//   dtrain::DeviceMesh mesh(world, {{"dp", -1}, {"tp", 2}});  // dp = world / 2
//   mesh.comm("tp");   // my tensor-parallel group
//   mesh.rank("dp");   // my coordinate along dp
#pragma once

#include <dtrain/comm.h>

#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace dtrain {

class DeviceMesh {
 public:
  // `dims`: (name, size) in layout order, outermost first. One size may be
  // -1: the world size divided by the others. Throws std::invalid_argument
  // (naming the numbers) when the sizes do not multiply to the world size,
  // when a size is < 1, or when names repeat or are empty. Collective: every
  // rank of `world` constructs the mesh with the same dims (one split per
  // dimension).
  DeviceMesh(CommPtr world, std::vector<std::pair<std::string, int>> dims);

  const CommPtr& world() const { return world_; }
  // The communicator of one dimension: the ranks that share every other
  // coordinate, ordered by their coordinate along it (its rank() is rank(name));
  // or one flatten() made.
  const CommPtr& comm(const std::string& name) const;
  int size(const std::string& name) const;
  int rank(const std::string& name) const;  // this rank's coordinate along `name`
  bool has(const std::string& name) const;        // a dimension
  bool has_comm(const std::string& name) const;   // a dimension or a flattened group

  // Collective: one communicator over several dimensions at once, e.g.
  // {"dp", "cp"} (FSDP shards over dp x cp under context parallelism): the
  // ranks that share every other coordinate, ordered row-major. comm(as)
  // returns it from then on. Throws std::invalid_argument for an unknown or
  // repeated name, or `as` already taken.
  const CommPtr& flatten(const std::vector<std::string>& names, const std::string& as);

  // The dimensions' names and sizes, in layout order.
  const std::vector<std::pair<std::string, int>>& dims() const { return dims_; }
  // The world rank at `coordinates` (one per dimension, layout order).
  int world_rank(const std::vector<int>& coordinates) const;
  // "(dp=2, tp=2)"
  std::string describe() const;

 private:
  size_t index_of(const std::string& name) const;

  CommPtr world_;
  std::vector<std::pair<std::string, int>> dims_;
  std::vector<int> coordinates_;  // this rank's
  std::vector<CommPtr> comms_;    // one per dimension
  std::deque<std::pair<std::string, CommPtr>> flattened_;  // a deque: comm()'s references stay valid
};

}  // namespace dtrain
