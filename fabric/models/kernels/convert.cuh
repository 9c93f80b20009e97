// 16-bit ↔ float32 conversions shared by Fabric++'s CUDA kernels (device code only).
#ifndef FABRIC_MODELS_KERNELS_CONVERT_CUH_
#define FABRIC_MODELS_KERNELS_CONVERT_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace fabric::kernels {

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

}  // namespace fabric::kernels

#endif  // FABRIC_MODELS_KERNELS_CONVERT_CUH_
