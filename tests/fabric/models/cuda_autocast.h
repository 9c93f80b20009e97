// Helpers of the CUDA model tests (fused_ops_cuda_test, fused_models_cuda_test): CUDA autocast on
// and off around a forward, and the largest difference relative to the reference's largest value.
#ifndef TESTS_FABRIC_MODELS_CUDA_AUTOCAST_H_
#define TESTS_FABRIC_MODELS_CUDA_AUTOCAST_H_

#include <ATen/autocast_mode.h>
#include <torch/types.h>

namespace fabric::testing {

inline void autocast_on(torch::ScalarType t) {
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, t);
}

inline void autocast_off() {
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
}

inline double max_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat) - b.to(torch::kFloat)).abs().max() /
          b.to(torch::kFloat).abs().max().clamp_min(1e-30))
      .item<double>();
}

}  // namespace fabric::testing

#endif  // TESTS_FABRIC_MODELS_CUDA_AUTOCAST_H_
