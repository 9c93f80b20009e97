// fabric::ScopeGuard: runs a function when it goes out of scope (movable, runs at most once).
// [[nodiscard]]: a guard dropped at once (`f.no_backward_sync(model);` as a statement) would end
// its scope on the same line, silently; compilers warn instead.
#ifndef FABRIC_CORE_SCOPE_GUARD_H_
#define FABRIC_CORE_SCOPE_GUARD_H_

#include <functional>
#include <utility>

namespace fabric {

class [[nodiscard]] ScopeGuard {
 public:
  ScopeGuard() = default;
  explicit ScopeGuard(std::function<void()> on_exit) : on_exit_(std::move(on_exit)) {}
  ScopeGuard(ScopeGuard&& other) noexcept : on_exit_(std::exchange(other.on_exit_, nullptr)) {}
  ScopeGuard& operator=(ScopeGuard&&) = delete;
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;
  ~ScopeGuard() {
    if (on_exit_) on_exit_();
  }

 private:
  std::function<void()> on_exit_;
};

}  // namespace fabric

#endif  // FABRIC_CORE_SCOPE_GUARD_H_
