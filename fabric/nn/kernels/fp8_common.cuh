// Device helpers every kernel that writes float8 under fp8-mixed shares (fp8_cast.cu's casts and
// fabric/models' LayerNorm that writes its output in float8): delayed scaling's scale from a
// history, the saturating conversion, and the block's largest magnitude taken into one word.
// Include after the CUDA headers (cuda_fp8.h among them).
#ifndef FABRIC_NN_KERNELS_FP8_COMMON_CUH_
#define FABRIC_NN_KERNELS_FP8_COMMON_CUH_

#include <cstdint>

namespace fabric::kernels {

// The larger of m and |a| kept as the largest magnitude so far, NaN sticking (a NaN seen makes the
// amax NaN, as ATen's amax does).
__device__ __forceinline__ float fp8_keep_max(float m, float a) {
  return (a > m || a != a) ? a : m;
}

// Delayed scaling's scale: largest / the largest finite entry of history[0 .. len) (NaN and
// infinity count as 0: a step that overflowed does not poison the next ones). Every thread of the
// block calls it: each reads every kThreads-th entry and the block shares one maximum, so a long
// history (Transformer Engine's default is 1024 steps) costs a few loads per thread, not `len`.
template <int kThreads>
__device__ float fp8_history_scale(const float* history, int len, float largest) {
  float h = 0.f;
  for (int i = threadIdx.x; i < len; i += kThreads) {
    const float a = history[i];
    if (fabsf(a) <= 3.402823466e38f) h = fmaxf(h, a);
  }
  int bits = __float_as_int(h);  // h >= 0: the bits order as the values do
  for (int o = 16; o > 0; o /= 2) bits = max(bits, __shfl_xor_sync(0xffffffff, bits, o));
  __shared__ int warp_max[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = bits;
  __syncthreads();
  for (int w = 0; w < kThreads / 32; ++w) bits = max(bits, warp_max[w]);
  return largest / fmaxf(__int_as_float(bits), 1e-12f);
}

// Two floats as two float8 bytes, the first in the low byte: (x · s) saturated to ±largest,
// rounded to nearest even (ATen's clamp then cast).
__device__ __forceinline__ uint32_t fp8_cvt2(float a, float b, __nv_fp8_interpretation_t kind) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, kind);
}

// The largest of the block's threads' m (m >= 0 or NaN) taken into *target with one atomic: as
// bits, for non-negative floats (and NaN, whose bits exceed infinity's) the integer order is the
// float order, so atomicMax on int finds the largest. Every thread of the block must call it.
template <int kThreads>
__device__ __forceinline__ void fp8_block_max_into(float m, float* target) {
  int bits = __float_as_int(m);
  for (int o = 16; o > 0; o /= 2) bits = max(bits, __shfl_xor_sync(0xffffffff, bits, o));
  __shared__ int warp_max[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = bits;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) bits = max(bits, warp_max[w]);
    atomicMax(reinterpret_cast<int*>(target), bits);
  }
}

}  // namespace fabric::kernels

#endif  // FABRIC_NN_KERNELS_FP8_COMMON_CUH_
