#include "fabric/precision/autocast.h"

#include <ATen/autocast_mode.h>

namespace fabric {

AutocastGuard::AutocastGuard(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled)
    : active_(true),
      device_type_(device_type),
      previous_enabled_(at::autocast::is_autocast_enabled(device_type)),
      previous_dtype_(at::autocast::get_autocast_dtype(device_type)) {
  at::autocast::set_autocast_enabled(device_type_, enabled);
  at::autocast::set_autocast_dtype(device_type_, dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::AutocastGuard(AutocastGuard&& other) noexcept
    : active_(other.active_),
      device_type_(other.device_type_),
      previous_enabled_(other.previous_enabled_),
      previous_dtype_(other.previous_dtype_) {
  other.active_ = false;
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // Casted weights are cached for the outermost region only (as in torch.autocast.__exit__).
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

}  // namespace fabric
