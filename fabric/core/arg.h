// FABRIC_ARG: one optional argument of an options struct, in LibTorch's style (torch/arg.h):
// a chainable setter and a getter of the same name, with its default beside it.
//
//   struct GradScalerOptions {
//     FABRIC_ARG(double, init_scale) = 65536.0;  // Default: 2^16.
//   };
//   auto options = GradScalerOptions().init_scale(1024).growth_interval(100);
//   double s = options.init_scale();
//
// Every options struct of the public API is written this way (required arguments, if any, go
// to its constructor); the implementation packages' internal option structs, filled by the
// Connector, are plain structs.
#ifndef FABRIC_CORE_ARG_H_
#define FABRIC_CORE_ARG_H_

#include <utility>

#define FABRIC_ARG(T, name)                                \
 public:                                                   \
  auto name(T new_value)->decltype(*this) {                \
    this->name##_ = std::move(new_value);                  \
    return *this;                                          \
  }                                                        \
  const T& name() const noexcept { return this->name##_; } \
                                                           \
 private:                                                  \
  T name##_

#endif  // FABRIC_CORE_ARG_H_
