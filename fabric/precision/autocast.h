// fabric::AutocastGuard: RAII autocast region, like Python's `with torch.autocast(...)`.
//
// Construction saves the thread's autocast state for `device_type`, then enables (or disables)
// autocast with `dtype`; destruction restores the saved state and, when leaving the outermost
// region, clears the autocast weight cache. Nesting-safe: an inner guard (e.g. enabled=false for a
// numerically sensitive block) is undone exactly. Keep backward() outside the guard.
//
// Thread-safety: autocast state is thread-local; a guard must be destroyed on its own thread.
//
// Example:
//   { fabric::AutocastGuard guard(c10::DeviceType::CUDA, at::kHalf); loss = model(x); }
#ifndef FABRIC_PRECISION_AUTOCAST_H_
#define FABRIC_PRECISION_AUTOCAST_H_

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace fabric {

class [[nodiscard]] AutocastGuard {  // dropped at once, it would end the region at once
 public:
  // A guard that does nothing (precisions without autocast).
  AutocastGuard() = default;
  AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled = true);
  ~AutocastGuard();

  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;
  AutocastGuard(AutocastGuard&& other) noexcept;
  AutocastGuard& operator=(AutocastGuard&&) = delete;

  bool active() const { return active_; }

 private:
  bool active_ = false;
  c10::DeviceType device_type_ = c10::DeviceType::CPU;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Undefined;
};

}  // namespace fabric

#endif  // FABRIC_PRECISION_AUTOCAST_H_
