// fabric::strategies::ModelParallel: tensor parallelism composed with fsdp (fabric.strategy:
// model_parallel), as Lightning's ModelParallelStrategy and TorchTitan compose them, on c10d.
//
// The world is a mesh {dp_shard: data_parallel_size, tp: tensor_parallel_size}, or with hybrid
// sharding {dp_replicate: R, dp_shard: data_parallel_size / R, tp} (data_parallel_replicate_size
// R: fsdp shards over dp_shard and the R copies all-reduce their gradient shards)
// (fabric/distributed/device_mesh.h; tp innermost, so tp partners are consecutive ranks, which
// launchers place on one node). setup_module() splits the module over its tp group by the plan
// the module carries (fabric::nn::TensorParallelPlanned, e.g. the GPT's) or the one given to
// set_plan(), then shards what each rank holds over its dp_shard group exactly as Fsdp does over
// the world. The sampler splits the data over the dp_shard coordinate only: the ranks of one tp
// group read the same batches. Gradient clipping takes the norm over the whole mesh (a split
// parameter counted on every tp rank, a whole one once). teardown() gathers everything whole
// again, so the module works alone after Fabric::launch returns.
//
// Checkpoints (checkpoint.format auto: sharded) are folders in which each rank writes its fsdp
// piece of its tp slice of every split tensor, as a run of the whole tensor's elements in the
// slices' order (fabric::slices_layout); with format full, one file gathered whole (fsdp's shards
// over dp_shard, then the tp slices over tp). Both load at any tp x dp shape and under every
// other strategy: loading reads each split tensor whole and cuts this rank's slice and its fsdp
// shard. ExponentialMovingAverage's parts (Fabric::parameter_parts) follow the same order.
// A LoRA layer's cut adapter tensor (fabric::nn::LinearImpl::lora_cut) is one of the split
// tensors: checkpoints, exports and materialize_parameters hold it whole.
// fabric.empty_init: the module is cut on the meta device and each rank replays the init, keeping
// its fsdp shard of its slice of each value.
#ifndef STRATEGIES_MODEL_PARALLEL_H_
#define STRATEGIES_MODEL_PARALLEL_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/nn/tensor_parallel.h"
#include "strategies/fsdp.h"

namespace fabric::distributed {
class DeviceMesh;
}  // namespace fabric::distributed

namespace fabric::strategies {

class ModelParallel : public Fsdp {
 public:
  ModelParallel(std::shared_ptr<ClusterEnvironment> environment, torch::Device device,
                std::unique_ptr<Precision> precision, const DdpOptions& ddp, FsdpOptions fsdp,
                ModelParallelOptions options, std::vector<std::string> argv);
  ~ModelParallel() override;

  std::string name() const override { return "model_parallel"; }
  int64_t data_parallel_size() const override { return options_mp_.data_parallel_size; }
  int64_t data_parallel_rank() const override;

  // Builds the mesh after the rendezvous (collective).
  void setup_environment() override;
  // The plan for the next setup_module, instead of the module's own (for programs that build
  // the strategy themselves; a Fabric program's model carries its plan: TensorParallelPlanned).
  void set_plan(fabric::nn::TensorParallelPlan plan) { plan_ = std::move(plan); }
  void setup_module(torch::nn::Module& module) override;
  void setup_optimizer(torch::optim::Optimizer& optimizer) override;
  torch::Tensor clip_gradients_norm(const std::vector<torch::Tensor>& parameters,
                                    torch::optim::Optimizer& optimizer, double max_norm,
                                    double norm_type) override;
  ScopeGuard materialize_parameters(torch::nn::Module& module, bool write_back) override;
  ParameterParts parameter_parts(torch::nn::Module& module) override;
  void teardown() override;

  // ShardedState: each rank's piece of its slices (sharded folders), or everything gathered
  // whole (one file); see above.
  std::optional<c10::IValue> local_module_state(torch::nn::Module& module) override;
  std::optional<c10::IValue> local_optimizer_state(torch::optim::Optimizer& optimizer) override;
  std::optional<c10::IValue> gather_optimizer_state(torch::optim::Optimizer& optimizer) override;
  std::optional<PieceRange> wanted_module_piece(const torch::nn::Module& module,
                                                const std::string& path, at::IntArrayRef sizes,
                                                at::IntArrayRef strides,
                                                const std::optional<PieceLayout>& layout) override;
  std::optional<PieceRange> wanted_optimizer_piece(
      const torch::optim::Optimizer& optimizer, const std::string& path, at::IntArrayRef sizes,
      at::IntArrayRef strides, const std::optional<PieceLayout>& layout) override;
  std::optional<std::function<void()>> prepare_local_module_state(
      torch::nn::Module& module, const c10::IValue& value, const std::string& source) override;
  std::optional<std::function<void()>> prepare_split_optimizer_state(
      torch::optim::Optimizer& optimizer, const c10::IValue& state,
      const std::string& source) override;

  // Pipeline parallelism (options.pipeline_parallel_size > 1): the mesh's pp group; the tied
  // embedding's second copy left out of the gradient norm; every stage's value pickled and
  // gathered over the pp group (checkpoints, Strategy::gather_pipeline_state's exports).
  c10::intrusive_ptr<c10d::ProcessGroup> pipeline_group() const override;
  // Context parallelism (options.context_parallel_size > 1): the mesh's cp group.
  c10::intrusive_ptr<c10d::ProcessGroup> context_parallel_group() const override;
  void set_shared_parameter(const torch::Tensor& parameter, bool counted_here) override;
  std::vector<c10::IValue> exchange_pipeline(const c10::IValue& mine, bool everyone) override;
  bool first_of_stage() const override;
  const ModelParallelOptions& options() const { return options_mp_; }

  // Null before setup_environment().
  const distributed::DeviceMesh* mesh() const { return mesh_.get(); }

 protected:
  const c10::intrusive_ptr<c10d::ProcessGroup>& data_parallel_group(
      const std::string& what) const override;
  void release() override;
  torch::Tensor initial_value(const torch::Tensor& held, const torch::Tensor& value) override;
  c10::intrusive_ptr<c10d::ProcessGroup> replicate_group() const override;

 private:
  // A tensor split over tp: its shard and the dimension it is cut along.
  struct Split {
    Split(fabric::nn::TensorParallelShard shard, int64_t along, std::vector<int64_t> whole_sizes);
    fabric::nn::TensorParallelShard shard;
    int64_t along = 0;
    std::vector<int64_t> whole_sizes;
    // Derived: this rank's slice's sizes; the order in which the ranks' slices lie one after
    // another as runs of the whole tensor (slices_layout; nullopt: its memory order); and where
    // this rank's run starts in it.
    std::vector<int64_t> slice_sizes;
    std::optional<PieceLayout> layout;
    int64_t start = 0;
  };
  Error unsupported(const std::string& what) const;
  // The optimizer's state (one process's layout) with each field of each split parameter's
  // state replaced by `map`'s value for it.
  // (`map` gets null for a parameter not split over tp.)
  using FieldMap = std::function<c10::IValue(const c10::IValue&, const Split*)>;
  c10::IValue map_split_fields(const c10::IValue& layout, const FieldMap& map) const;
  // ... with each split parameter's buffers whole (`gather`, collective over tp) or cut to this
  // rank's slice.
  c10::IValue map_split_buffers(const c10::IValue& layout, bool gather) const;
  // `v`, fsdp's piece of this rank's slice of `split` (or the slice itself), as a piece of the
  // whole tensor (sharded checkpoints); for a tensor not split over tp (null), fsdp's piece on
  // tp rank 0 and an empty one on the others (they hold the same).
  c10::IValue whole_piece(const c10::IValue& v, const Split* split) const;
  int64_t tp_rank() const;
  // Loading a sharded checkpoint: this rank's elements of split tensor `s` (`sizes`, `strides`,
  // `layout` from its descriptor) as one run, `inner`'s run of the slice (fsdp's) placed in the
  // slice's run, where the checkpoint lays the slices out as this job cuts them; else nullopt
  // (read whole and cut).
  std::optional<PieceRange> run_of_slice(
      const Split& s, at::IntArrayRef sizes, at::IntArrayRef strides,
      const std::optional<PieceLayout>& layout,
      const std::function<std::optional<PieceRange>(at::IntArrayRef)>& inner) const;
  // Such a piece as a piece of this rank's slice (what fsdp loads); other values unchanged.
  c10::IValue piece_of_slice(const c10::IValue& v, const Split& s) const;
  int64_t replica() const;  // this rank's dp_replicate coordinate (0 without HSDP)

  std::map<std::string, Split> module_splits_;  // the split module's split tensors, by name
  std::map<const void*, const Split*> split_of_tensor_;  // the same, by TensorImpl
  std::vector<std::optional<Split>> optimizer_splits_;   // per parameter, in the optimizer's order

  ModelParallelOptions options_mp_;
  std::unique_ptr<distributed::DeviceMesh> mesh_;
  std::optional<fabric::nn::TensorParallelPlan> plan_;
  std::set<const void*> uncounted_;  // set_shared_parameter(p, false), by TensorImpl
  torch::nn::Module* split_module_ = nullptr;
  std::weak_ptr<torch::nn::Module> owner_;  // split_module_'s, when a shared_ptr owns it
  bool owned_ = false;
  bool keep_mesh_ = false;  // teardown: the tp groups are still needed after fsdp's release
};

}  // namespace fabric::strategies

#endif  // STRATEGIES_MODEL_PARALLEL_H_
