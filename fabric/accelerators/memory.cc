#include "fabric/accelerators/memory.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#ifdef FABRIC_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace fabric {
namespace {

// Counts the bytes of the CPU allocator's live allocations. The data pointer is its own context
// (as LibTorch's default CPU allocator makes it), so raw_allocate/raw_deleter keep working; the
// size and the wrapped deleter of each allocation are kept in a table.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    const auto bytes = static_cast<int64_t>(n);
    const int64_t limit = limit_.load(std::memory_order_relaxed);
    const int64_t now = allocated_.fetch_add(bytes) + bytes;
    if (limit > 0 && now > limit) {
      allocated_.fetch_sub(bytes);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ",
                       format_bytes(bytes), " with ", format_bytes(now - bytes),
                       " of tensors alive, over this process's limit of ", format_bytes(limit),
                       " (fabric.tensor_memory_limit_gb)");
    }
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    c10::DataPtr inner;
    try {
      inner = base_->allocate(n);
    } catch (...) {
      allocated_.fetch_sub(bytes);
      throw;
    }
    void* data = inner.get();
    if (data == nullptr || inner.get_context() != data) {
      allocated_.fetch_sub(bytes);  // not one we can follow: leave it uncounted
      return inner;
    }
    const c10::DeleterFnPtr deleter = inner.get_deleter();
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_[data] = {bytes, deleter};
    }
    return {data, data, &CountingCpuAllocator::free, inner.device()};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingCpuAllocator::free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  static void free(void* data);

  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> limit_{0};

 private:
  struct Entry {
    int64_t bytes;
    c10::DeleterFnPtr deleter;
  };
  c10::Allocator* base_;
  std::mutex mutex_;
  std::unordered_map<void*, Entry> live_;
};

std::atomic<bool> g_installed{false};

CountingCpuAllocator* counting() {
  // Installed once, never removed (allocations it made may outlive any scope).
  static CountingCpuAllocator* instance = [] {
    auto* a = new CountingCpuAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(a, /*priority=*/100);
    g_installed.store(true);
    return a;
  }();
  return instance;
}

}  // namespace

void CountingCpuAllocator::free(void* data) {
  CountingCpuAllocator* self = counting();
  Entry entry{0, nullptr};
  {
    std::lock_guard<std::mutex> lock(self->mutex_);
    auto it = self->live_.find(data);
    if (it != self->live_.end()) {
      entry = it->second;
      self->live_.erase(it);
    }
  }
  self->allocated_.fetch_sub(entry.bytes);
  if (entry.deleter != nullptr) entry.deleter(data);
}

#ifdef FABRIC_WITH_CUDA
namespace {
// The caching allocator's per-device state exists only after CUDA's lazy initialisation (the
// first CUDA tensor, or this); before it, its setters and statistics throw "Allocator not
// initialized for device" (seen on an H200 when fabric.tensor_memory_limit_gb was set first).
c10::DeviceIndex ready_cuda_index(c10::Device device) {
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  return device.has_index() ? device.index() : c10::cuda::current_device();
}
}  // namespace
#endif

MemoryStats memory_stats(c10::Device device) {
  MemoryStats s;
  if (device.is_cpu()) {
    CountingCpuAllocator* a = counting();
    s.allocated = a->allocated_.load();
    s.peak = a->peak_.load();
    s.limit = a->limit_.load();
    return s;
  }
#ifdef FABRIC_WITH_CUDA
  if (device.is_cuda()) {
    const auto index = ready_cuda_index(device);
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    s.allocated = stats.allocated_bytes[all].current;
    s.peak = stats.allocated_bytes[all].peak;
    const double fraction = c10::cuda::CUDACachingAllocator::getMemoryFraction(index);
    size_t free_bytes = 0, total = 0;
    if (fraction < 1.0 && cudaMemGetInfo(&free_bytes, &total) == cudaSuccess)
      s.limit = static_cast<int64_t>(fraction * static_cast<double>(total));
    return s;
  }
#endif
  return s;
}

bool memory_counted(c10::Device device) { return device.is_cuda() || g_installed.load(); }

void reset_peak_memory(c10::Device device) {
  if (device.is_cpu()) {
    CountingCpuAllocator* a = counting();
    a->peak_.store(a->allocated_.load());
    return;
  }
#ifdef FABRIC_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(ready_cuda_index(device));
#endif
}

void set_memory_limit(c10::Device device, int64_t bytes) {
  if (device.is_cpu()) {
    counting()->limit_.store(bytes > 0 ? bytes : 0);
    return;
  }
#ifdef FABRIC_WITH_CUDA
  if (device.is_cuda()) {
    const auto index = ready_cuda_index(device);
    size_t free_bytes = 0, total = 0;
    c10::cuda::CUDAGuard guard(index);
    TORCH_CHECK(cudaMemGetInfo(&free_bytes, &total) == cudaSuccess, "cudaMemGetInfo failed");
    const double fraction =
        bytes > 0 ? std::min(1.0, static_cast<double>(bytes) / static_cast<double>(total)) : 1.0;
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, index);
  }
#endif
}

void release_cached_memory(c10::Device device) {
#ifdef FABRIC_WITH_CUDA
  if (device.is_cuda()) {
    ready_cuda_index(device);
    c10::cuda::CUDACachingAllocator::emptyCache();
  }
#else
  (void)device;
#endif
}

int64_t available_host_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

bool is_out_of_memory(const std::exception& e) {
  return dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr;
}

int64_t parse_bytes(const std::string& text) {
  const auto bad = [&] {
    return std::invalid_argument("'" + text +
                                 "' is no size; write bytes, or a number with B, KB, MB, GB, "
                                 "KiB, MiB, GiB or TiB (512MiB, 1.5GB)");
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t end = i;
  while (end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.'))
    ++end;
  if (end == i) throw bad();
  double value = 0;
  try {
    value = std::stod(text.substr(i, end - i));
  } catch (...) {
    throw bad();
  }
  std::string unit;
  for (size_t k = end; k < text.size(); ++k)
    if (!std::isspace(static_cast<unsigned char>(text[k])))
      unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[k])));
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  const char* prefixes = "KMGT";
  for (int p = 0; p < 4 && scale == 0; ++p) {
    if (unit == std::string(1, prefixes[p]) + "B") scale = std::pow(1000.0, p + 1);
    if (unit == std::string(1, prefixes[p]) + "IB") scale = std::pow(1024.0, p + 1);
  }
  if (scale == 0 || !std::isfinite(value)) throw bad();
  return static_cast<int64_t>(std::llround(value * scale));
}

std::string format_bytes(int64_t bytes) {
  char text[64];
  const double b = static_cast<double>(bytes);
  if (std::llabs(bytes) >= (int64_t{1} << 30))
    std::snprintf(text, sizeof(text), "%.2f GiB", b / (1 << 30));
  else if (std::llabs(bytes) >= (int64_t{1} << 20))
    std::snprintf(text, sizeof(text), "%.1f MiB", b / (1 << 20));
  else if (std::llabs(bytes) >= 1024)
    std::snprintf(text, sizeof(text), "%.1f KiB", b / 1024);
  else
    std::snprintf(text, sizeof(text), "%lld B", static_cast<long long>(bytes));
  return text;
}

}  // namespace fabric
