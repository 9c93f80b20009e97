// fabric::distributed::DeviceMesh: the job's ranks as a grid of named dimensions (dp_replicate,
// dp_shard, tp, ...), with one process group per dimension.
//
// Ranks are laid out row-major over the dimensions as given, the last one innermost: with
// {dp_shard: 2, tp: 2}, ranks 0 and 1 are the tp partners of dp coordinate 0, ranks 2 and 3 those
// of coordinate 1. Put `tp` last so tensor-parallel partners are consecutive ranks, which launchers
// place on one node.
//
// For every dimension, this rank joins the process group of the ranks that share its coordinates on
// every other dimension (make_process_group over the job's store under "mesh/<name>/<index>/": Gloo
// or shared memory for CPU tensors, NCCL for CUDA ones, as the world's group). A flattened
// dimension ("dp" over {dp_replicate, dp_shard}) gets a group of its own over those dimensions
// together. Groups are built once, in the constructor, by every rank in the same order.
//
//   DeviceMesh mesh(store, options, {{"dp_shard", 2}, {"tp", 2}});
//   mesh.size("tp");        // 2
//   mesh.coordinate("tp");  // this rank's index among its tp partners
//   mesh.group("tp");       // their process group
//
// Thread-safety: const methods may be called from any thread; the groups are c10d's.
#ifndef FABRIC_DISTRIBUTED_DEVICE_MESH_H_
#define FABRIC_DISTRIBUTED_DEVICE_MESH_H_

#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fabric/distributed/process_group.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace fabric::distributed {

struct MeshDim {
  std::string name;
  int64_t size = 1;
};

// A flattened dimension: `name` over `dims` (in mesh order, adjacent or not).
struct MeshFlatten {
  std::string name;
  std::vector<std::string> dims;
};

class DeviceMesh {
 public:
  // `options.rank` and `options.world_size` are the job's; the product of the sizes must be the
  // world size (fabric::Error naming the shape otherwise), names unique and not empty, sizes >= 1.
  DeviceMesh(const c10::intrusive_ptr<c10d::Store>& store, const ProcessGroupOptions& options,
             std::vector<MeshDim> dims, std::vector<MeshFlatten> flatten = {});
  // A mesh without groups (layout only, e.g. to place ranks or to plan a checkpoint's pieces).
  DeviceMesh(int64_t rank, std::vector<MeshDim> dims, std::vector<MeshFlatten> flatten = {});
  ~DeviceMesh();
  DeviceMesh(const DeviceMesh&) = delete;
  DeviceMesh& operator=(const DeviceMesh&) = delete;

  int64_t rank() const { return rank_; }
  int64_t world_size() const;
  const std::vector<MeshDim>& dims() const { return dims_; }
  // Whether `name` is a dimension or a flattened one.
  bool has(const std::string& name) const;
  // A dimension's (or flattened dimension's) size; fabric::Error naming the mesh's dimensions for
  // any other name.
  int64_t size(const std::string& name) const;
  // This rank's index along `name` (a flattened one: row-major over its dimensions).
  int64_t coordinate(const std::string& name) const;
  // The global ranks of this rank's group along `name`, in group-rank order.
  std::vector<int64_t> ranks(const std::string& name) const;
  // The global rank at `coordinates` (one per dimension, in mesh order).
  int64_t rank_at(const std::vector<int64_t>& coordinates) const;
  // That group. fabric::Error for a mesh built without groups.
  const c10::intrusive_ptr<c10d::ProcessGroup>& group(const std::string& name) const;
  // "dp_shard=2 x tp=2".
  std::string describe() const;

 private:
  std::vector<int64_t> dims_of(const std::string& name) const;  // indices into dims_

  int64_t rank_;
  std::vector<MeshDim> dims_;
  std::vector<MeshFlatten> flatten_;
  std::vector<int64_t> coordinates_;
  std::map<std::string, c10::intrusive_ptr<c10d::ProcessGroup>> groups_;
};

}  // namespace fabric::distributed

#endif  // FABRIC_DISTRIBUTED_DEVICE_MESH_H_
