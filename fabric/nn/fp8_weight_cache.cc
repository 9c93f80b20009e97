// fp8-mixed's weight casts kept while the weight is unchanged (fp8.h: release_fp8_weights;
// fp8_quantize.h: quantize_weight). One registry per process, keyed by the weight's TensorImpl.
#include <c10/core/InferenceMode.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iterator>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "fabric/nn/fp8.h"
#include "fabric/nn/fp8_quantize.h"

#ifdef FABRIC_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace fabric::nn {

namespace detail {
namespace {

// What a cast was made of: the weight's memory and version (any in-place change bumps it), its
// layout, and how it was scaled.
struct Key {
  const void* data = nullptr;
  int64_t version = -1;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  bool rowwise = false, delayed = false;
};

Key key_of(const torch::Tensor& w, bool rowwise, bool delayed) {
  return {w.data_ptr(),    static_cast<int64_t>(w._version()),
          w.sizes().vec(), w.strides().vec(),
          w.scalar_type(), w.device(),
          rowwise,         delayed};
}

// Whether w (cast with rowwise, delayed) is what k was made of; compared in place, so the pass
// that finds its cast kept makes no copy of the sizes.
bool same(const Key& k, const torch::Tensor& w, bool rowwise, bool delayed) {
  return k.data == w.data_ptr() && k.version == static_cast<int64_t>(w._version()) &&
         w.sizes() == c10::IntArrayRef(k.sizes) && w.strides() == c10::IntArrayRef(k.strides) &&
         k.dtype == w.scalar_type() && k.device == w.device() && k.rowwise == rowwise &&
         k.delayed == delayed;
}

// One weight's state. The weak reference keeps the TensorImpl's address from being reused by
// another tensor while the entry exists (an expired one is dropped).
struct Entry {
  explicit Entry(const torch::Tensor& w)
      : weight(c10::weak_intrusive_ptr<c10::TensorImpl>(w.getIntrusivePtr())) {}
  c10::weak_intrusive_ptr<c10::TensorImpl> weight;
  bool excluded = false;    // set_fp8_weight_cached(w, false)
  std::optional<Key> key;   // what the passes since the last change cast
  int64_t passes = 0;       // passes over `key`
  int64_t last_passes = 0;  // passes over the key before (0: none yet)
  bool pushed = false;      // delayed: a training pass pushed this key's amax
  // Delayed, the key's first cast not kept: a copy of the history row it read (undefined: it
  // took the weight's own amax).
  torch::Tensor snapshot;
  // A kept cast made by a pass that did not train, from a seeded history: the row as the key's
  // first training pass will leave it (the cast recorded and pushed the amax into this copy).
  torch::Tensor pending;
  std::optional<Quantized> bits;

  void forget() {
    if (key) last_passes = passes;
    key.reset();
    passes = 0;
    pushed = false;
    snapshot = torch::Tensor();
    pending = torch::Tensor();
    bits.reset();
  }
};

struct Registry {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, Entry> entries;
  size_t swept_at = 64;  // sweep expired entries when the map grows past this
  bool on = true;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: used from autograd threads at exit
  return *r;
}

std::atomic<int64_t> g_casts{0};

void sweep(Registry& r) {
  for (auto it = r.entries.begin(); it != r.entries.end();)
    it = it->second.weight.expired() ? r.entries.erase(it) : std::next(it);
  r.swept_at = std::max<size_t>(64, 2 * r.entries.size());
}

void forget_all(Registry& r) {
  for (auto& [impl, e] : r.entries) e.forget();
}

// w's entry, an expired one (another tensor's) dropped first; made when missing and `make`, else
// null then.
Entry* find(Registry& r, const torch::Tensor& w, bool make) {
  c10::TensorImpl* impl = w.unsafeGetTensorImpl();
  auto it = r.entries.find(impl);
  if (it != r.entries.end() && it->second.weight.expired()) {
    r.entries.erase(it);
    it = r.entries.end();
  }
  if (it != r.entries.end()) return &it->second;
  if (!make) return nullptr;
  if (r.entries.size() >= r.swept_at) sweep(r);
  return &r.entries.emplace(impl, Entry(w)).first->second;
}

// The live entry of w (made when missing), or null when the cast is not to be kept: the cache
// off, w excluded or an inference tensor, inference mode (its tensors cannot be saved for a
// later backward), or a CUDA graph being captured (a cast skipped at capture would be missing
// from every replay).
Entry* entry_for(Registry& r, const torch::Tensor& w) {
  if (!r.on || w.is_inference() || c10::InferenceMode::is_enabled()) return nullptr;
#ifdef FABRIC_WITH_CUDA
  if (w.is_cuda() &&
      c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None)
    return nullptr;
#endif
  Entry* e = find(r, w, /*make=*/true);
  return e->excluded ? nullptr : e;
}

Quantized cast(const torch::Tensor& w, bool rowwise, const std::optional<Delayed>& d) {
  g_casts.fetch_add(1, std::memory_order_relaxed);
  return quantize(w, torch::kFloat8_e4m3fn, kE4m3Max, rowwise, d ? &*d : nullptr);
}

}  // namespace

// Per key (the weight unchanged): the first pass casts as without the cache (its history row
// read, and pushed when it trains) and keeps the cast when the key before saw two passes or more
// (else only what the cast read: no memory is held for a weight read once between changes); a
// later pass reuses the kept cast, or makes it again from what the first read (the same bits)
// and keeps it. Delayed scaling: the first training pass of a key is the one that pushes the
// weight's amax (a key first cast by a pass that did not train is cast again by it, from the
// same history: the same bits), so the row advances once per weight change, not once per pass.
Quantized quantize_weight(const torch::Tensor& weight, bool rowwise, const torch::Tensor& history,
                          const torch::Tensor& seeded, bool record) {
  Registry& r = registry();
  std::unique_lock<std::mutex> lock(r.mutex);
  Entry* e = entry_for(r, weight);
  if (e == nullptr) {
    lock.unlock();
    return cast(weight, rowwise, delayed_operand(history, seeded, 1, record));
  }
  const bool delayed = history.numel() > 0;
  if (!e->key || !same(*e->key, weight, rowwise, delayed)) {
    e->forget();
    e->key = key_of(weight, rowwise, delayed);
  }
  ++e->passes;
  if (delayed && record && !e->pushed && e->passes > 1) {
    // The key's first training pass after passes that did not train (activation checkpointing's
    // recomputation, after its first run): they left the history as they found it, so its cast
    // is theirs, and it pushes the amax: the row the first pass's cast pushed into a copy, or
    // (nothing kept) a cast again from the live row.
    e->pushed = true;
    const std::optional<Delayed> d = delayed_operand(history, seeded, 1, true);
    if (e->pending.defined()) {  // (kept, and made from the seeded history)
      d->row.copy_(e->pending);
      e->pending = torch::Tensor();
      return *e->bits;
    }
    e->bits = cast(weight, rowwise, d);
    return *e->bits;
  }
  if (e->bits) return *e->bits;
  if (e->passes == 1) {
    const std::optional<Delayed> d = delayed_operand(history, seeded, 1, record);
    // The pass that seeds the history casts with the weight's own amax written into it: kept.
    const bool keep = e->last_passes >= 2 || (d && d->seed);
    std::optional<Delayed> use = d;
    if (d && !keep) e->snapshot = d->row.clone();  // before the cast pushes into it
    if (d && keep && !d->record) {
      // A pass that does not train: the same scale, its amax recorded and pushed into a copy of
      // the row for the key's first training pass to take (no cast of its own then).
      e->pending = d->row.clone();
      use = Delayed{e->pending, /*seed=*/false, /*record=*/true, /*margin=*/0};
    }
    Quantized q = cast(weight, rowwise, use);
    e->pushed = d && d->record;
    if (keep) e->bits = q;
    return q;
  }
  std::optional<Delayed> again;
  if (e->snapshot.defined())
    again = Delayed{e->snapshot, /*seed=*/false, /*record=*/false, /*margin=*/0};
  e->bits = cast(weight, rowwise, again);
  e->snapshot = torch::Tensor();
  return *e->bits;
}

}  // namespace detail

void release_fp8_weights() {
  detail::Registry& r = detail::registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  detail::forget_all(r);
  detail::sweep(r);
}

void set_fp8_weight_cache(bool on) {
  detail::Registry& r = detail::registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.on = on;
  if (!on) detail::forget_all(r);
}

void set_fp8_weight_cached(const torch::Tensor& weight, bool cached) {
  if (!weight.defined()) return;
  detail::Registry& r = detail::registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  detail::Entry* e = detail::find(r, weight, /*make=*/!cached);  // none: cached, the default
  if (e == nullptr) return;
  e->excluded = !cached;
  e->forget();
}

int64_t fp8_weight_casts() { return detail::g_casts.load(std::memory_order_relaxed); }

}  // namespace fabric::nn
