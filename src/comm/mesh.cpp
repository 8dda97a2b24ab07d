#include "dtrain/mesh.h"

#include <set>
#include <sstream>
#include <stdexcept>

namespace dtrain {
namespace {

std::string shape_text(const std::vector<std::pair<std::string, int>>& dims) {
  std::ostringstream text;
  text << "(";
  for (size_t i = 0; i < dims.size(); ++i) text << (i ? ", " : "") << dims[i].first << "=" << dims[i].second;
  text << ")";
  return text.str();
}

}  // namespace

DeviceMesh::DeviceMesh(CommPtr world, std::vector<std::pair<std::string, int>> dims)
    : world_(std::move(world)), dims_(std::move(dims)) {
  if (!world_) throw std::invalid_argument("DeviceMesh: no world communicator");
  if (dims_.empty()) throw std::invalid_argument("DeviceMesh: no dimensions");
  std::set<std::string> names;
  int known = 1;
  int inferred = -1;
  for (size_t i = 0; i < dims_.size(); ++i) {
    const auto& [name, size] = dims_[i];
    if (name.empty() || !names.insert(name).second)
      throw std::invalid_argument("DeviceMesh " + shape_text(dims_) + ": dimension names must be distinct and non-empty");
    if (size == -1 && inferred < 0) {
      inferred = static_cast<int>(i);
    } else if (size < 1) {
      throw std::invalid_argument("DeviceMesh " + shape_text(dims_) + ": every size must be >= 1 (one may be -1)");
    } else {
      known *= size;
    }
  }
  const int world_size = world_->size();
  if (inferred >= 0) {
    if (world_size % known != 0)
      throw std::invalid_argument("DeviceMesh " + shape_text(dims_) + ": " + std::to_string(world_size) +
                                  " ranks are not a multiple of " + std::to_string(known));
    dims_[inferred].second = world_size / known;
  } else if (known != world_size) {
    throw std::invalid_argument("DeviceMesh " + shape_text(dims_) + ": the sizes multiply to " + std::to_string(known) +
                                ", not the " + std::to_string(world_size) + " ranks of the world");
  }
  // Row-major coordinates of this rank, last dimension innermost.
  coordinates_.assign(dims_.size(), 0);
  int rest = world_->rank();
  for (size_t i = dims_.size(); i-- > 0;) {
    coordinates_[i] = rest % dims_[i].second;
    rest /= dims_[i].second;
  }
  // Dimension d's group: the ranks whose other coordinates equal ours. Its
  // color is our world rank with coordinate d set to 0 (unique per group);
  // the key orders the group by coordinate d.
  for (size_t d = 0; d < dims_.size(); ++d) {
    std::vector<int> base = coordinates_;
    base[d] = 0;
    comms_.push_back(world_->split(world_rank(base), coordinates_[d]));
  }
}

size_t DeviceMesh::index_of(const std::string& name) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].first == name) return i;
  throw std::invalid_argument("DeviceMesh " + describe() + " has no dimension '" + name + "'");
}

const CommPtr& DeviceMesh::comm(const std::string& name) const {
  for (const auto& [as, comm] : flattened_)
    if (as == name) return comm;
  return comms_[index_of(name)];
}

const CommPtr& DeviceMesh::flatten(const std::vector<std::string>& names, const std::string& as) {
  if (names.empty() || as.empty() || has(as))
    throw std::invalid_argument("DeviceMesh::flatten: a name for the group and the dimensions it spans, not '" + as + "'");
  for (const auto& [taken, comm] : flattened_)
    if (taken == as) throw std::invalid_argument("DeviceMesh::flatten: '" + as + "' is already a flattened group");
  std::vector<bool> spanned(dims_.size(), false);
  for (const auto& name : names) {
    const size_t d = index_of(name);
    if (spanned[d]) throw std::invalid_argument("DeviceMesh::flatten: '" + name + "' named twice");
    spanned[d] = true;
  }
  // As for one dimension: the color is our world rank with the spanned
  // coordinates set to 0; the world rank orders the group row-major.
  std::vector<int> base = coordinates_;
  for (size_t d = 0; d < dims_.size(); ++d)
    if (spanned[d]) base[d] = 0;
  flattened_.emplace_back(as, world_->split(world_rank(base), world_->rank()));
  return flattened_.back().second;
}
int DeviceMesh::size(const std::string& name) const { return dims_[index_of(name)].second; }
int DeviceMesh::rank(const std::string& name) const { return coordinates_[index_of(name)]; }

bool DeviceMesh::has(const std::string& name) const {
  for (const auto& dim : dims_)
    if (dim.first == name) return true;
  return false;
}

bool DeviceMesh::has_comm(const std::string& name) const {
  for (const auto& flattened : flattened_)
    if (flattened.first == name) return true;
  return has(name);
}

int DeviceMesh::world_rank(const std::vector<int>& coordinates) const {
  if (coordinates.size() != dims_.size())
    throw std::invalid_argument("DeviceMesh::world_rank: " + std::to_string(coordinates.size()) +
                                " coordinates for a mesh of " + std::to_string(dims_.size()) + " dimensions");
  int rank = 0;
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (coordinates[i] < 0 || coordinates[i] >= dims_[i].second)
      throw std::invalid_argument("DeviceMesh::world_rank: coordinate " + std::to_string(coordinates[i]) + " along " +
                                  dims_[i].first + " is outside 0.." + std::to_string(dims_[i].second - 1));
    rank = rank * dims_[i].second + coordinates[i];
  }
  return rank;
}

std::string DeviceMesh::describe() const { return shape_text(dims_); }

}  // namespace dtrain
