// fabric::strategies::ShardedParameters: the parameters of a module fully sharded over the ranks
// (fabric.strategy: fsdp, strategies/fsdp.h): each rank keeps 1/N of every unit's values and
// gradients, and a unit's parameters exist whole only while an operation needs them.
//
// Units. The parameters are grouped into units by a wrapping policy: a submodule becomes a unit
// when its type is named in `wrap_modules` or when the parameters under it that no inner unit
// took reach `min_unit_params`; what is left is the root unit. Parameters that do not require
// gradients (a LoRA model's frozen base) go into frozen units of their own beside each unit, one
// per dtype (a base kept in bfloat16 beside float32 norms): sharded and gathered the same way,
// never reduced, never in the optimizer; a unit and its frozen siblings count as one for
// freeing, so an adapted layer's base and adapters are gathered together. A frozen parameter
// that shares memory with another parameter (tied) stays whole on every rank. A unit's
// parameters are laid end to end (module order, each at a multiple of 128 bytes: flat_layout in
// optimizer_shard.h) in one flat vector of T elements padded to N·S, S ≥ ⌈T/N⌉ a multiple of 128
// bytes; rank r keeps elements [r·S, (r+1)·S) in its shard, and the parameters become views
// of the unit's full buffer, whose memory is freed while the unit is sharded (the tensors keep
// their shapes; their storage holds no bytes).
//
// The trigger. LibTorch modules have no forward hooks and the user calls `model->forward`, so
// nothing runs before a unit's forward. Instead a thread-local RecordFunction callback sees the
// inputs of every operator the training thread (and the autograd threads, which inherit its
// thread-local state) dispatches; the first operator that takes a parameter of a sharded unit
// gathers the unit (one all-gather of the shards into the full buffer) before the operator runs.
// This covers the forward, the backward (autograd's saved tensors are views of the same buffer)
// and anything else that reads a parameter. Gathers are collectives: every rank must run the
// same operators on the same units in the same order (no rank-dependent control flow).
//
// Freeing. In the forward (outside backward()), gathering a unit frees every other gathered unit
// except the root and the unit's siblings when `reshard_after_forward` (full_shard; shard_grad_op
// keeps them until their gradients are reduced); in the backward, gathering a unit frees the
// other frozen units the same way (they have no gradients whose reduction would free them). In a
// synchronized backward, once every parameter of a unit has its gradient (post hooks on the
// gradient accumulators), the gradients ×1/N (the Reducer's factor) are reduce-scattered into the
// unit's shard gradient, the parameters' own gradients are released and the unit is freed.
// end_backward() reduces units whose parameters got no gradient (as zeros, in unit order) and frees
// every unit. Outside synchronization (no_backward_sync) the parameters keep their gradients whole
// and accumulate, and the next synchronized backward reduces the sum. A unit is gathered again
// whenever something uses it after it was freed.
//
// Requires: one device per unit and one dtype per unit of trainable parameters; no trainable
// tensors sharing memory between parameters (tied weights); parameters are written only by the
// optimizer (through the shards) or by materialize().
//
// Empty init. Parameters on the meta device (a module built under fabric::EmptyInit) have shapes
// but no values: each unit is laid out as usual on policy.empty_init_device (its full buffer
// exists only while the unit is formed), its shard starts as zeros, and take_initial_value()
// copies this rank's elements of each parameter's replayed value into it. The setup then holds
// the shards, one unit and one parameter's value at a time, never the model.
#ifndef STRATEGIES_SHARDED_PARAMETERS_H_
#define STRATEGIES_SHARDED_PARAMETERS_H_

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "fabric/checkpoint/sharded.h"
#include "fabric/core/scope_guard.h"
#include "fabric/training/parameter_parts.h"
#include "strategies/optimizer_shard.h"

namespace c10d {
class ProcessGroup;
class Work;
}  // namespace c10d

namespace torch::autograd {
struct Node;
}  // namespace torch::autograd

namespace fabric::strategies {

struct ShardingPolicy {
  std::vector<std::string> wrap_modules;  // module type names (torch::nn::LinearImpl: "Linear")
  int64_t min_unit_params = 0;            // 0: no size rule
  bool reshard_after_forward = true;      // fabric.fsdp.reshard_after_forward
  // The wire dtypes (fabric.fsdp.param_dtype, reduce_dtype; nullopt: the unit's own). A unit
  // gathered for compute holds its values rounded through param_dtype (every rank the same);
  // materialize() and gather_all_into_parameters() gather the exact values.
  std::optional<torch::ScalarType> param_dtype;
  std::optional<torch::ScalarType> reduce_dtype;
  // fabric.fsdp.prefetch: when a unit is gathered, start the asynchronous all-gather of the unit
  // that came next in the same phase (forward, backward) of the previous pass.
  bool prefetch = false;
  // Where the units live when the module's parameters are on the meta device (an empty init,
  // fabric/nn/empty_init.h): the shards start as zeros and take their values from
  // take_initial_value.
  torch::Device empty_init_device = torch::kCPU;
  // fabric.fsdp.cpu_offload: the shards and their gradients live in host memory (pinned when the
  // units are on CUDA); a gather copies the shard to the units' device first, a reduce-scatter
  // lands on the device and is copied (or added) into the host gradient. The optimizer's pieces
  // (views of the shards) are then host tensors: it steps there.
  bool cpu_offload = false;
};

class ShardedParameters {
 public:
  // After the module was moved, converted and made equal on every rank. One instance per process
  // at a time (the trigger is process-wide). Collective only in that every rank must build the
  // same units; throws fabric::Error "fabric.fsdp...: ..." naming the parameter at fault.
  ShardedParameters(torch::nn::Module& module, c10::intrusive_ptr<c10d::ProcessGroup> pg,
                    ShardingPolicy policy);
  // Removes the trigger and the hooks. The parameters are left as they are (see gather_all).
  // Hybrid sharding (HSDP): the group of ranks that hold the same shards as this one (null:
  // none). After the reduce-scatter each shard's gradient is all-reduced over it, and the
  // gradients are averaged over both groups. Before the first backward.
  void set_replicate_group(c10::intrusive_ptr<c10d::ProcessGroup> group);
  ~ShardedParameters();
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;

  // Around the loss's backward. `sync`: reduce the gradients (else they accumulate whole).
  // `accumulate`: add the reduced gradients to the shard gradients instead of replacing them
  // (the optimizer's pieces still hold gradients from an earlier synchronized backward).
  void begin_backward(bool sync, bool accumulate);
  void end_backward();  // collective when synchronizing
  // After the optimizer changed the shards: every gathered unit is stale and freed.
  void after_step();

  // Collective. While the guard lives every unit is whole (gathered, never freed) and the
  // module's parameters hold their full values. `write_back`: when the guard ends, each rank
  // takes its part of the (possibly written) full values into its shards.
  ScopeGuard materialize(bool write_back);
  // Collective: every parameter gets memory of its own again holding its full value (after
  // training, so that the module works without this class).
  void gather_all_into_parameters();
  // Instead (a model that may not fit one rank): every parameter of a unit goes to the meta
  // device (its shape and dtype, no memory) and the shards are freed. No communication.
  void drop_to_meta();

  // `module`'s state (its parameters and buffers by name, as fabric::state_dict names them),
  // each parameter of a unit as this rank's piece of it (fabric/checkpoint/sharded.h), for
  // sharded checkpoints. No communication; nothing is gathered.
  c10::IValue local_state(const torch::nn::Module& module) const;

  // `module`'s floating-point parameters as this rank holds them: a sharded parameter as its
  // elements in this rank's shard (a view the optimizer updates), the others whole.
  std::vector<ParameterPart> parts(const torch::nn::Module& module) const;

  // Loading without gathering: the elements of parameter `path` (its name as sharded_path
  // writes it) this rank keeps, given the tensor's shape and strides in the checkpoint (nullopt:
  // not a sharded parameter of this shape; read it whole).
  std::optional<PieceRange> wanted(const std::string& path, at::IntArrayRef sizes,
                                   at::IntArrayRef strides) const;
  // What loads `module`'s state `value` (name → tensor, the sharded parameters whole or as the
  // pieces wanted() named) into this rank's shards and the other tensors, then frees every
  // gathered unit (stale). No communication; throws fabric::Error "SOURCE: ..." as
  // load_state_dict does and changes nothing.
  std::function<void()> prepare_load(const torch::nn::Module& module, const c10::IValue& value,
                                     const std::string& source);

  // An empty init's value of a parameter of a unit (`held`: the module's parameter object): this
  // rank's elements of it go into its shard. False when `held` is no parameter of a unit.
  bool take_initial_value(const torch::Tensor& held, const torch::Tensor& value);

  // The flat memory for OptimizerShard (one segment per unit).
  OptimizerShard::Segments segments() const;

  // The units `policy` makes of `module`'s parameters, inner ones first (each unit before its
  // frozen siblings), the root last, without sharding anything (tools/estimate_memory). Throws
  // fabric::Error as the constructor does for a wrap_modules name that matches no module or tied
  // parameters.
  struct PlannedUnit {
    std::string name;
    bool root = false;
    bool frozen = false;  // parameters that do not require gradients
    size_t group = 0;     // a unit and its frozen siblings share it
    std::vector<std::string> names;
    std::vector<torch::Tensor> params;
  };
  static std::vector<PlannedUnit> plan_units(const torch::nn::Module& module,
                                             const ShardingPolicy& policy);

  // The units, in order: name (module path, "(root)"; a frozen unit's with " (frozen)") and
  // elements.
  struct UnitInfo {
    std::string name;
    bool root = false;
    bool frozen = false;
    int64_t elements;  // of its parameters
    int64_t parameters;
    int64_t gathered_elements;  // N·S: the unit gathered (its layout's gaps and padding too)
  };
  std::vector<UnitInfo> units() const;
  // Gathers (all-gathers of a unit) and reduce-scatters since construction.
  int64_t gathers() const { return gathers_; }
  int64_t reduce_scatters() const { return reduce_scatters_; }
  // All-gathers started ahead of use (fabric.fsdp.prefetch).
  int64_t prefetches() const { return prefetches_; }
  // Bytes of full buffers gathered right now, and the most at any time since construction.
  int64_t gathered_bytes() const { return gathered_bytes_; }
  int64_t peak_gathered_bytes() const { return peak_gathered_bytes_; }

  // The trigger's entry point (internal): gathers the sharded units whose parameters are among
  // an operator's inputs before it runs.
  void on_operator_inputs(c10::ArrayRef<const c10::IValue> inputs);

 private:
  struct Unit {
    std::string name;
    bool root = false;
    bool frozen = false;  // no gradients: never reduced, not in the optimizer's segments
    size_t group = 0;     // PlannedUnit::group
    std::vector<torch::Tensor> params;
    std::vector<std::string> names;
    std::vector<int64_t> offsets;
    int64_t total = 0;
    int64_t shard_size = 0;
    torch::Tensor full;        // N·S elements; its storage holds bytes only while gathered
    torch::Tensor shard;       // S elements of this rank
    torch::Tensor shard_grad;  // S elements (undefined for a frozen unit)
    bool gathered = false;
    bool exact = false;  // gathered in its own dtype (not rounded through param_dtype)
    c10::intrusive_ptr<c10d::Work> pending;  // a prefetch in flight into `full`
    torch::Tensor pending_send;              // what it sends (kept alive until it ends)
    torch::Tensor pending_received;          // its buffer when gathered in param_dtype
    int pins = 0;                            // materialize() guards holding it whole
    size_t grads_ready = 0;                  // parameters whose gradient arrived in this backward
    bool reduced = false;                    // reduce-scattered in this backward
  };

  // This rank's elements [x, y) of parameter i of `unit`, as offsets into the parameter.
  std::pair<int64_t, int64_t> own_range(const Unit& unit, size_t i) const;
  // Those elements in this rank's shard (a view; empty when it keeps none).
  torch::Tensor own_values(const Unit& unit, size_t i) const;
  // `exact`: in the unit's own dtype even when param_dtype is set (a unit gathered rounded is
  // gathered again).
  void gather(Unit& unit, bool exact = false);
  // The constructor's steps: the units (inner ones first, the root last; policy_ decides), each
  // unit's parameters moved into one flat buffer of which this rank keeps its shard, and the
  // hooks that reduce a unit's gradients once they are all accumulated.
  void form_units(torch::nn::Module& module);
  void flatten_unit(size_t k);
  void install_gradient_hooks();
  void release(Unit& unit);  // frees the full buffer's memory (after a prefetch in flight)
  // Starts the all-gather of `unit` (allocating its buffer unless gathered) without waiting;
  // finish_gather waits for it (and upcasts a param_dtype gather into the buffer).
  void start_gather(Unit& unit, bool exact);
  void finish_gather(Unit& unit);
  // What a gather sends of `shard`: the tensor itself, or under cpu_offload its copy on the
  // units' device (always a copy, even when that is the CPU: one code path).
  torch::Tensor on_device(const torch::Tensor& shard, const Unit& unit) const;
  // The order units were first used in this phase; prefetch the one after `k` in the last pass.
  void note_use(size_t k);
  void reduce(Unit& unit);  // the gradients into the shard gradient; collective
  void on_gradient(size_t unit);

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  ShardingPolicy policy_;
  c10::intrusive_ptr<c10d::ProcessGroup> replicate_;  // set_replicate_group
  int64_t rank_ = 0;
  int64_t world_ = 1;
  std::vector<Unit> units_;
  std::unordered_map<const void*, size_t> unit_of_storage_;
  std::unordered_map<std::string, std::pair<size_t, size_t>> by_path_;  // sharded_path: unit, index
  std::unordered_map<const void*, std::pair<size_t, size_t>> by_object_;  // TensorImpl: the same
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive for the hooks
  std::vector<std::pair<std::shared_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
  uint64_t callback_ = 0;
  bool in_backward_ = false;
  bool sync_ = true;
  bool accumulate_ = false;
  std::vector<size_t> used_now_;                        // units in order of first use in this phase
  std::vector<size_t> forward_order_, backward_order_;  // the previous pass's
  int64_t prefetches_ = 0;
  int64_t gathers_ = 0;
  int64_t reduce_scatters_ = 0;
  int64_t gathered_bytes_ = 0;
  int64_t peak_gathered_bytes_ = 0;
};

}  // namespace fabric::strategies

#endif  // STRATEGIES_SHARDED_PARAMETERS_H_
