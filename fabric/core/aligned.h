// Where a tensor's data starts, for the CUDA kernels that load 8 or 16 bytes at a time: a view
// that starts mid-allocation (a slice, a parameter inside a flat fsdp buffer) may not start on
// such a boundary, and a misaligned vector load fails the launch.
#ifndef FABRIC_CORE_ALIGNED_H_
#define FABRIC_CORE_ALIGNED_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace fabric {

// Whether t's data starts on a multiple of `bytes`.
inline bool starts_aligned(const at::Tensor& t, uintptr_t bytes = 16) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % bytes == 0;
}

// t contiguous and starting on 16 bytes: t itself when it is, else a copy (a fresh allocation).
inline at::Tensor contiguous_aligned(const at::Tensor& t) {
  at::Tensor x = t.contiguous();
  return starts_aligned(x) ? x : x.clone();
}

}  // namespace fabric

#endif  // FABRIC_CORE_ALIGNED_H_
