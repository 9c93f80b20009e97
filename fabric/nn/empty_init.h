// fabric::EmptyInit: build a module without allocating its parameters, and materialise them later
// with the values a full construction gives (Fabric's init_module(empty_init=true), Accelerate's
// init_empty_weights), whole or piece by piece.
//
// While an EmptyInit lives, the thread's tensor operations pass through a recorder on LibTorch's
// DeferredInit dispatch key (the key the dispatcher keeps for deferred module initialisation): a
// factory operation whose device is left unsaid (torch::empty, torch::randn, what
// torch::nn::Linear's constructor calls) makes a tensor on the meta device, which has a shape and
// a dtype but no memory, and every operation that takes or makes such a tensor is recorded in
// order (the factory, the init functions' uniform_/normal_, views, copies, set_data, dtype
// conversions). Nothing is computed and the default generator is not advanced.
//
// InitRecord::replay then runs the recorded operations again with real CPU tensors, the default
// CPU generator set to where it stood when the recording began, and hands over each of the
// module's meta tensors (parameters and buffers) once the last operation that writes it ran;
// real tensors are freed after their last use, so the memory at any time is the tensors the
// recording kept alive at that point (usually one parameter), not the model. Because the
// operations and the generator are the same, the values are exactly those of a full construction
// with that seed, on any number of ranks (each replays the same record; fsdp keeps only its
// shard of each value: strategies/sharded_parameters.h).
//
// Limits (a construction that breaks one fails with a fabric::Error, never silently):
// - Construct on the CPU, with the default device; a factory that names a device (torch::kCPU,
//   torch::kCUDA) makes a real tensor, which the recording keeps as a constant.
// - No reading of values while recording: .item(), data_ptr() writes, accessors and .to(kCPU)
//   of a meta tensor fail (LibTorch's meta device refuses them).
// - Random operations on the CPU generator replay exactly; CUDA ones draw from the CUDA generator
//   as it stands at replay.
// - One recording per thread at a time.
#ifndef FABRIC_NN_EMPTY_INIT_H_
#define FABRIC_NN_EMPTY_INIT_H_

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace fabric {

class InitRecord;

class EmptyInit {
 public:
  EmptyInit();   // starts recording on this thread; throws fabric::Error if one already is
  ~EmptyInit();  // stops
  EmptyInit(const EmptyInit&) = delete;
  EmptyInit& operator=(const EmptyInit&) = delete;

  // What was recorded (shared: the record outlives the scope).
  std::shared_ptr<InitRecord> record() const { return record_; }

 private:
  std::shared_ptr<InitRecord> record_;
  struct Guard;
  std::unique_ptr<Guard> guard_;
};

// A scope in which this thread's tensor operations run for real even while an EmptyInit records:
// for constants a constructor computes that are neither parameters nor buffers (a model's rotary
// frequencies), which would otherwise be meta tensors mixed with real ones. Nothing here is
// recorded or replayed. Without an EmptyInit it changes nothing.
class NotRecorded {
 public:
  NotRecorded();
  ~NotRecorded();
  NotRecorded(const NotRecorded&) = delete;
  NotRecorded& operator=(const NotRecorded&) = delete;

 private:
  struct Guard;
  std::unique_ptr<Guard> guard_;
};

class InitRecord {
 public:
  struct Node;
  InitRecord();
  ~InitRecord();

  // Replays the record and calls `take(name, held, value)` once for each tensor of `module`
  // (parameters and buffers, by their state_dict names) that the recording made: `held` is
  // the module's tensor object, `value` its CPU value (in the dtype the recording gave it; a
  // conversion made after the recording, such as a precision's, is the caller's). `take` keeps
  // what it needs; the rest is freed. Afterwards the default CPU generator stands where a full
  // construction leaves it. Throws fabric::Error naming the tensor for a meta tensor the record
  // did not make, and for an operation that fails to replay. Once per record.
  using Take =
      std::function<void(const std::string& name, torch::Tensor& held, const torch::Tensor& value)>;
  void replay(const torch::nn::Module& module, const Take& take) const;

  // The default CPU generator's state when the recording began (replay starts from it); ranks
  // that must agree set rank 0's (strategies broadcast it) before replaying.
  const torch::Tensor& generator_state() const { return generator_state_; }
  void set_generator_state(torch::Tensor state) { generator_state_ = std::move(state); }

  size_t operations() const;  // recorded

  // Whether the recording made `t` (a parameter already given memory by a strategy still
  // counts).
  bool made(const torch::Tensor& t) const;

 private:
  friend class EmptyInit;
  friend struct RecordAccess;
  void seal();  // when the recording ends: when each tensor it made is last used
  std::vector<Node> nodes_;
  torch::Tensor generator_state_;
  // Per tensor the recording made (by object): the operation after which its value is final
  // (the last one that mentions it or its storage), and whether the tensor is dropped then.
  std::unordered_map<const c10::TensorImpl*, size_t> final_after_;
};

// True while an EmptyInit records on this thread (what is built now gets its values at setup).
bool recording_empty_init();

// True when a parameter or buffer of `module` is on the meta device (an empty init to
// materialise).
bool has_meta_tensors(const torch::nn::Module& module);

// held.set_data(value), also from or to the meta device (which Tensor::set_data refuses): the
// object stays, so a module's members, its parameter list and optimizers see the change.
void replace_data(const torch::Tensor& held, const torch::Tensor& value);

// Every meta tensor of `module` becomes real on `device` with its replayed value (converted to
// the dtype the tensor has now): the whole-model strategies' materialisation.
void materialize(torch::nn::Module& module, const InitRecord& record, torch::Device device);

}  // namespace fabric

#endif  // FABRIC_NN_EMPTY_INIT_H_
