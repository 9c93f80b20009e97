#include "fabric/distributed/device_mesh.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <set>

#include "fabric/core/error.h"

namespace fabric::distributed {

namespace {

std::string shape_of(const std::vector<MeshDim>& dims) {
  std::string s;
  for (const MeshDim& d : dims)
    s += (s.empty() ? "" : " x ") + d.name + "=" + std::to_string(d.size);
  return s.empty() ? "(no dimensions)" : s;
}

}  // namespace

DeviceMesh::DeviceMesh(int64_t rank, std::vector<MeshDim> dims, std::vector<MeshFlatten> flatten)
    : rank_(rank), dims_(std::move(dims)), flatten_(std::move(flatten)) {
  std::set<std::string> names;
  for (const MeshDim& d : dims_) {
    if (d.name.empty() || d.size < 1 || !names.insert(d.name).second)
      throw Error("DeviceMesh: " + shape_of(dims_) +
                  ": every dimension needs a unique name and a size of at least 1");
  }
  for (const MeshFlatten& f : flatten_) {
    if (f.dims.empty() || !names.insert(f.name).second)
      throw Error("DeviceMesh: flattened dimension '" + f.name +
                  "' needs a new name and at least one dimension");
    for (const std::string& d : f.dims)
      if (std::none_of(dims_.begin(), dims_.end(), [&](const MeshDim& m) { return m.name == d; }))
        throw Error("DeviceMesh: flattened dimension '" + f.name + "' names '" + d +
                    "', which is not a dimension of " + shape_of(dims_));
  }
  if (rank_ < 0 || rank_ >= world_size())
    throw Error("DeviceMesh: rank " + std::to_string(rank_) + " is outside " + shape_of(dims_));
  coordinates_.assign(dims_.size(), 0);
  int64_t rest = rank_;
  for (size_t i = dims_.size(); i-- > 0;) {
    coordinates_[i] = rest % dims_[i].size;
    rest /= dims_[i].size;
  }
}

DeviceMesh::DeviceMesh(const c10::intrusive_ptr<c10d::Store>& store,
                       const ProcessGroupOptions& options, std::vector<MeshDim> dims,
                       std::vector<MeshFlatten> flatten)
    : DeviceMesh(options.rank, std::move(dims), std::move(flatten)) {
  if (world_size() != options.world_size)
    throw Error("DeviceMesh: " + shape_of(dims_) + " holds " + std::to_string(world_size()) +
                " ranks, but the job has " + std::to_string(options.world_size) +
                "; make the sizes' product the world size");
  std::vector<std::string> names;
  for (const MeshDim& d : dims_) names.push_back(d.name);
  for (const MeshFlatten& f : flatten_) names.push_back(f.name);
  for (const std::string& name : names) {
    const std::vector<int64_t> members = ranks(name);
    // The group's index: its smallest member's rank identifies it among the groups of `name`.
    const std::string prefix = "mesh/" + name + "/" + std::to_string(members.front());
    ProcessGroupOptions o = options;
    o.rank = coordinate(name);
    o.world_size = static_cast<int64_t>(members.size());
    groups_[name] = make_process_group(c10::make_intrusive<c10d::PrefixStore>(prefix, store), o);
  }
}

DeviceMesh::~DeviceMesh() = default;

int64_t DeviceMesh::world_size() const {
  int64_t n = 1;
  for (const MeshDim& d : dims_) n *= d.size;
  return n;
}

bool DeviceMesh::has(const std::string& name) const {
  return std::any_of(dims_.begin(), dims_.end(),
                     [&](const MeshDim& d) { return d.name == name; }) ||
         std::any_of(flatten_.begin(), flatten_.end(),
                     [&](const MeshFlatten& f) { return f.name == name; });
}

std::vector<int64_t> DeviceMesh::dims_of(const std::string& name) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].name == name) return {static_cast<int64_t>(i)};
  for (const MeshFlatten& f : flatten_) {
    if (f.name != name) continue;
    std::vector<int64_t> out;
    for (size_t i = 0; i < dims_.size(); ++i)
      if (std::find(f.dims.begin(), f.dims.end(), dims_[i].name) != f.dims.end())
        out.push_back(static_cast<int64_t>(i));
    return out;
  }
  std::string known;
  for (const MeshDim& d : dims_) known += (known.empty() ? "" : ", ") + d.name;
  for (const MeshFlatten& f : flatten_) known += (known.empty() ? "" : ", ") + f.name;
  throw Error("DeviceMesh: '" + name + "' is not a dimension of this mesh (" + known + ")");
}

int64_t DeviceMesh::size(const std::string& name) const {
  int64_t n = 1;
  for (int64_t i : dims_of(name)) n *= dims_[i].size;
  return n;
}

int64_t DeviceMesh::coordinate(const std::string& name) const {
  int64_t c = 0;
  for (int64_t i : dims_of(name)) c = c * dims_[i].size + coordinates_[i];
  return c;
}

std::vector<int64_t> DeviceMesh::ranks(const std::string& name) const {
  const std::vector<int64_t> along = dims_of(name);
  std::vector<int64_t> out;
  const int64_t n = size(name);
  for (int64_t k = 0; k < n; ++k) {
    std::vector<int64_t> c = coordinates_;
    int64_t rest = k;
    for (size_t j = along.size(); j-- > 0;) {
      c[along[j]] = rest % dims_[along[j]].size;
      rest /= dims_[along[j]].size;
    }
    out.push_back(rank_at(c));
  }
  return out;
}

int64_t DeviceMesh::rank_at(const std::vector<int64_t>& coordinates) const {
  if (coordinates.size() != dims_.size())
    throw Error("DeviceMesh::rank_at: " + std::to_string(coordinates.size()) + " coordinates for " +
                shape_of(dims_));
  int64_t r = 0;
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (coordinates[i] < 0 || coordinates[i] >= dims_[i].size)
      throw Error("DeviceMesh::rank_at: coordinate " + std::to_string(coordinates[i]) +
                  " is outside " + dims_[i].name + "=" + std::to_string(dims_[i].size));
    r = r * dims_[i].size + coordinates[i];
  }
  return r;
}

const c10::intrusive_ptr<c10d::ProcessGroup>& DeviceMesh::group(const std::string& name) const {
  dims_of(name);  // names the mesh's dimensions for an unknown one
  auto it = groups_.find(name);
  if (it == groups_.end())
    throw Error("DeviceMesh::group('" + name + "'): this mesh was built without process groups");
  return it->second;
}

std::string DeviceMesh::describe() const { return shape_of(dims_); }

}  // namespace fabric::distributed
