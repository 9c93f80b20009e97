#include "fabric/nn/empty_init.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "fabric/core/error.h"

namespace fabric {

struct InitRecord::Node {
  c10::OperatorHandle op;
  std::vector<c10::IValue> inputs;  // as called (the device left unsaid stays unsaid)
  // The tensors it returned, per return (one for a tensor, several for a list), held weakly: a
  // strong reference would make LibTorch's C++ factories (torch::empty) wrap their result in a
  // new tensor object instead of the one returned, and the objects are what replay follows.
  std::vector<std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>>> outputs;
  // The meta storages it mentions, as they were (kept alive so that no other takes the address).
  std::vector<c10::Storage> storages;
};

namespace {

thread_local InitRecord* t_recording = nullptr;

template <typename F>
void for_each_tensor(const c10::IValue& v, const F& f) {
  if (v.isTensor()) {
    f(v.toTensor());
  } else if (v.isTensorList() || v.isList()) {
    for (const c10::IValue& e : v.toListRef()) for_each_tensor(e, f);
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) for_each_tensor(e, f);
  }
}

bool has_meta(const std::vector<c10::IValue>& values) {
  bool meta = false;
  for (const auto& v : values)
    for_each_tensor(v, [&](const at::Tensor& t) { meta = meta || (t.defined() && t.is_meta()); });
  return meta;
}

}  // namespace

// The recorder's access to a record (the fallback below is a free function).
struct RecordAccess {
  static std::vector<InitRecord::Node>& nodes(InitRecord& r) { return r.nodes_; }
};

namespace {

void record_operation(const c10::OperatorHandle& op, c10::DispatchKeySet,
                      torch::jit::Stack* stack) {
  InitRecord* record = t_recording;
  const auto& schema = op.schema();
  const size_t n_in = schema.arguments().size();
  std::vector<c10::IValue> inputs(stack->end() - static_cast<std::ptrdiff_t>(n_in), stack->end());
  bool made_meta = false;
  if (record != nullptr) {
    // A factory whose device is left unsaid makes a meta tensor.
    for (size_t i = 0; i < n_in; ++i) {
      const auto& arg = schema.arguments()[i];
      c10::IValue& v = (*stack)[stack->size() - n_in + i];
      if (arg.name() == "device" && v.isNone() &&
          arg.type()->kind() == c10::TypeKind::OptionalType) {
        v = c10::IValue(c10::Device(c10::kMeta));
        made_meta = true;
      }
    }
  }
  {
    c10::impl::ExcludeDispatchKeyGuard off(c10::DispatchKey::DeferredInit);
    op.callBoxed(stack);
  }
  if (record == nullptr) return;
  const size_t n_out = schema.returns().size();
  const std::vector<c10::IValue> outputs(stack->end() - static_cast<std::ptrdiff_t>(n_out),
                                         stack->end());
  if (!made_meta && !has_meta(inputs) && !has_meta(outputs)) return;  // real: a constant
  InitRecord::Node node{op, {}, {}, {}};
  for (const auto& v : outputs) {
    node.outputs.emplace_back();
    for_each_tensor(v, [&](const at::Tensor& t) {
      if (t.defined()) node.outputs.back().emplace_back(t.getIntrusivePtr());
    });
  }
  // Inputs were taken before the call; an in-place operation's storage may have changed since
  // (set_data), so storages are read from both sides.
  auto note = [&](const at::Tensor& t) {
    if (!t.defined() || !t.is_meta() || !t.has_storage()) return;
    node.storages.push_back(t.storage());
  };
  for (const auto& v : inputs) for_each_tensor(v, note);
  for (const auto& v : outputs) for_each_tensor(v, note);
  node.inputs = std::move(inputs);
  RecordAccess::nodes(*record).push_back(std::move(node));
}

}  // namespace

TORCH_LIBRARY_IMPL(_, DeferredInit, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&record_operation>());
}

struct EmptyInit::Guard {
  c10::impl::IncludeDispatchKeyGuard include{c10::DispatchKey::DeferredInit};
};

EmptyInit::EmptyInit() : record_(std::make_shared<InitRecord>()) {
  if (t_recording != nullptr)
    throw Error("empty init: this thread is recording an empty init already (one at a time)");
  auto gen = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    record_->generator_state_ = gen.get_state();
  }
  t_recording = record_.get();
  guard_ = std::make_unique<Guard>();
}

EmptyInit::~EmptyInit() {
  guard_.reset();
  t_recording = nullptr;
  record_->seal();
}

bool recording_empty_init() { return t_recording != nullptr; }

InitRecord::InitRecord() = default;
InitRecord::~InitRecord() = default;
size_t InitRecord::operations() const { return nodes_.size(); }

bool has_meta_tensors(const torch::nn::Module& module) {
  for (const auto& p : module.parameters())
    if (p.defined() && p.is_meta()) return true;
  for (const auto& b : module.buffers())
    if (b.defined() && b.is_meta()) return true;
  return false;
}

void InitRecord::seal() {
  // When each meta tensor and each meta storage is last mentioned, as recorded (a write through
  // a view mentions the view, which shares the parameter's storage).
  std::unordered_map<const c10::TensorImpl*, size_t> last_use;
  std::unordered_map<const c10::StorageImpl*, size_t> storage_last_use;
  std::unordered_map<const c10::TensorImpl*, c10::weak_intrusive_ptr<c10::TensorImpl>> made;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    for (const c10::Storage& s : nodes_[i].storages) storage_last_use[s.unsafeGetStorageImpl()] = i;
    for (const auto& v : nodes_[i].inputs)
      for_each_tensor(v, [&](const at::Tensor& t) {
        if (t.defined() && t.is_meta()) last_use[t.unsafeGetTensorImpl()] = i;
      });
    for (const auto& slot : nodes_[i].outputs)
      for (const auto& w : slot) {
        const c10::TensorImpl* impl = w._unsafe_get_target();
        last_use[impl] = i;
        made.emplace(impl, w);
      }
  }
  for (const auto& [impl, weak] : made) {
    size_t at = last_use[impl];
    // A tensor still alive (the module's) is final after the last write to its storage.
    if (auto t = weak.lock(); t && t->has_storage()) {
      auto it = storage_last_use.find(t->storage().unsafeGetStorageImpl());
      if (it != storage_last_use.end()) at = std::max(at, it->second);
    }
    final_after_[impl] = at;
  }
}

bool InitRecord::made(const torch::Tensor& t) const {
  return t.defined() && final_after_.count(t.unsafeGetTensorImpl()) > 0;
}

void InitRecord::replay(const torch::nn::Module& module, const Take& take) const {
  // The module's tensors the recording made, by object (a tied tensor is handed over once).
  struct Held {
    std::string name;
    torch::Tensor tensor;
  };
  std::vector<Held> held;
  std::unordered_set<const c10::TensorImpl*> is_held;
  std::vector<std::vector<size_t>> ready_at(nodes_.size());
  auto add = [&](const std::string& name, const torch::Tensor& t) {
    if (!t.defined()) return;
    auto it = final_after_.find(t.unsafeGetTensorImpl());
    if (it == final_after_.end()) {
      if (t.is_meta())
        throw Error("empty init: '" + name +
                    "' is on the meta device but the empty init did not make it (made outside "
                    "the scope, or on purpose); make it inside the scope or give it a device");
      return;
    }
    if (!is_held.insert(t.unsafeGetTensorImpl()).second) return;
    ready_at[it->second].push_back(held.size());
    held.push_back({name, t});
  };
  for (const auto& item : module.named_parameters()) add(item.key(), item.value());
  for (const auto& item : module.named_buffers()) add(item.key(), item.value());
  std::vector<std::vector<const c10::TensorImpl*>> drop_at(nodes_.size());
  for (const auto& [impl, at] : final_after_)
    if (!is_held.count(impl)) drop_at[at].push_back(impl);

  // The recorded tensors by object (a held one may have memory by now: a strategy set it up).
  std::unordered_map<const c10::TensorImpl*, at::Tensor> real;
  std::function<c10::IValue(const c10::IValue&, size_t)> to_real = [&](const c10::IValue& x,
                                                                       size_t node) -> c10::IValue {
    if (x.isTensor()) {
      const at::Tensor& t = x.toTensor();
      if (!t.defined() || !final_after_.count(t.unsafeGetTensorImpl())) return x;  // a constant
      auto it = real.find(t.unsafeGetTensorImpl());
      if (it == real.end())
        throw Error("empty init: operation " + std::to_string(node) + " (" +
                    nodes_[node].op.schema().name() +
                    ") takes a tensor made after it (replayed twice?)");
      return it->second;
    }
    if (x.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : x.toTensorList()) out.push_back(to_real(t, node).toTensor());
      return out;
    }
    if (x.isList() && !x.toListRef().empty() &&
        (x.toListRef()[0].isTensor() || x.toListRef()[0].isNone())) {
      c10::List<std::optional<at::Tensor>> out;
      for (const c10::IValue& e : x.toListRef())
        out.push_back(e.isNone() ? std::optional<at::Tensor>() : to_real(e, node).toTensor());
      return out;
    }
    return x;
  };
  auto bind = [&](const std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>>& recorded,
                  const c10::IValue& got) {
    std::vector<at::Tensor> reals;
    for_each_tensor(got, [&](const at::Tensor& t) {
      if (t.defined()) reals.push_back(t);
    });
    for (size_t k = 0; k < recorded.size() && k < reals.size(); ++k)
      real[recorded[k]._unsafe_get_target()] = reals[k];
  };

  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());  // the kernels take it too: not held after
    gen.set_state(generator_state_);
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node& node = nodes_[i];
    torch::jit::Stack stack;
    stack.reserve(node.inputs.size());
    for (const auto& v : node.inputs) stack.push_back(to_real(v, i));
    try {
      node.op.callBoxed(&stack);
    } catch (const c10::Error& e) {
      throw Error("empty init: replaying operation " + std::to_string(i) + " (" +
                  node.op.schema().name() + ") failed: " + e.what_without_backtrace());
    }
    for (size_t j = 0; j < node.outputs.size() && j < stack.size(); ++j)
      bind(node.outputs[j], stack[j]);
    for (size_t h : ready_at[i]) {
      auto it = real.find(held[h].tensor.unsafeGetTensorImpl());
      if (it == real.end()) continue;
      const at::Tensor value = std::move(it->second);
      real.erase(it);
      take(held[h].name, held[h].tensor, value);
    }
    for (const c10::TensorImpl* impl : drop_at[i]) real.erase(impl);
  }
}

void replace_data(const torch::Tensor& held, const torch::Tensor& value) {
  if (!held.is_meta() && !value.is_meta()) {
    held.set_data(value);
    return;
  }
  // Variable::set_data refuses a meta tensor (LibTorch counts meta as another tensor type,
  // though it is the same TensorImpl); this is its body without that check.
  if (auto* meta = torch::autograd::impl::get_autograd_meta(held)) {
    std::lock_guard<std::mutex> lock(meta->mutex_);
    meta->grad_accumulator_.reset();  // made for the other device
  }
  held.unsafeGetTensorImpl()->shallow_copy_from(value.getIntrusivePtr());
}

void materialize(torch::nn::Module& module, const InitRecord& record, torch::Device device) {
  record.replay(module, [&](const std::string&, torch::Tensor& held, const torch::Tensor& value) {
    replace_data(held, value.to(device, held.scalar_type()).contiguous());
  });
}

struct NotRecorded::Guard {
  c10::impl::ExcludeDispatchKeyGuard off{c10::DispatchKey::DeferredInit};
};

NotRecorded::NotRecorded() : guard_(std::make_unique<Guard>()) {}
NotRecorded::~NotRecorded() = default;

}  // namespace fabric
