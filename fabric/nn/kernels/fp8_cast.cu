// Float8 quantization for fabric/nn/fp8.cc: the largest magnitude of a tensor (one read, one
// atomic per block), then the scaled, saturated cast written row-major and transposed from one
// read through a shared-memory tile (_scaled_mm wants the backward's operands column-major).
#include "fabric/nn/kernels/fp8_cast.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace fabric::kernels {
namespace {

constexpr int kAmaxThreads = 256;
constexpr int kTile = 32;     // cast: a kTile × kTile tile per block
constexpr int kTileRows = 8;  // cast: blockDim (kTile, kTileRows)

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }

// |v| as bits: for non-negative floats (and NaN, whose bits exceed infinity's) the integer order
// is the float order, so atomicMax on int finds the largest.
template <typename T>
__global__ void __launch_bounds__(kAmaxThreads)
    amax_kernel(const T* __restrict__ x, int64_t n, float* amax) {
  float m = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float a = fabsf(load(x, i));
    m = (a > m || a != a) ? a : m;  // keeps a NaN
  }
  int bits = __float_as_int(m);
  for (int o = 16; o > 0; o /= 2) bits = max(bits, __shfl_xor_sync(0xffffffff, bits, o));
  __shared__ int warp_max[kAmaxThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = bits;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kAmaxThreads / 32; ++w) bits = max(bits, warp_max[w]);
    atomicMax(reinterpret_cast<int*>(amax), bits);
  }
}

__device__ __forceinline__ float scale_of(float amax, float largest) {
  return largest / (amax != amax ? amax : fmaxf(amax, 1e-12f));
}

__device__ __forceinline__ float keep_max(float m, float a) { return (a > m || a != a) ? a : m; }

// Tensorwise (kAxes false): one scale from amax[0] for q and qt, *row_inverse = its inverse.
// Axiswise (kAxes true): q's row r scaled by row_amax[r], qt's row c (x's column c) by
// col_amax[c]; row_inverse[r] and col_inverse[c] their inverses.
template <typename T, bool kAxes>
__global__ void __launch_bounds__(kTile* kTileRows)
    cast_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, bool e5m2,
                const float* __restrict__ row_amax, const float* __restrict__ col_amax,
                __nv_fp8_storage_t* __restrict__ q, __nv_fp8_storage_t* __restrict__ qt,
                float* __restrict__ row_inverse, float* __restrict__ col_inverse) {
  const float largest = e5m2 ? 57344.f : 448.f;
  const float tensor_scale = kAxes ? 0.f : scale_of(row_amax[0], largest);
  const __nv_fp8_interpretation_t kind = e5m2 ? __NV_E5M2 : __NV_E4M3;
  if (!kAxes && row_inverse != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 &&
      threadIdx.y == 0)
    *row_inverse = 1.f / tensor_scale;
  __shared__ __nv_fp8_storage_t tile[kTile][kTile + 4];
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  const int64_t col = col0 + threadIdx.x;
  const float col_scale = kAxes && col < cols ? scale_of(col_amax[col], largest) : tensor_scale;
  if (kAxes && blockIdx.y == 0 && threadIdx.y == 0 && col < cols && col_inverse != nullptr)
    col_inverse[col] = 1.f / col_scale;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t row0 = rt * kTile;
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const int64_t row = row0 + r;
      if (row < rows && col < cols) {
        // (x · s) saturated to ±largest, rounded to nearest even: ATen's clamp then cast.
        const float v = load(x, row * cols + col);
        const float row_scale = kAxes ? scale_of(row_amax[row], largest) : tensor_scale;
        if (kAxes && blockIdx.x == 0 && threadIdx.x == 0 && row_inverse != nullptr)
          row_inverse[row] = 1.f / row_scale;
        const __nv_fp8_storage_t vq = __nv_cvt_float_to_fp8(v * row_scale, __NV_SATFINITE, kind);
        if (q != nullptr) q[row * cols + col] = vq;
        tile[r][threadIdx.x] =
            kAxes ? __nv_cvt_float_to_fp8(v * col_scale, __NV_SATFINITE, kind) : vq;
      }
    }
    if (qt == nullptr) continue;
    __syncthreads();
    for (int c = threadIdx.y; c < kTile; c += kTileRows) {
      const int64_t tcol = col0 + c, row = row0 + threadIdx.x;
      if (row < rows && tcol < cols) qt[tcol * rows + row] = tile[threadIdx.x][c];
    }
    __syncthreads();
  }
}

// row_amax[r] = max over the row, col_amax[c] = max over the column; one atomic per tile row
// and per tile column.
template <typename T>
__global__ void __launch_bounds__(kTile* kTileRows)
    amax_axes_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, float* row_amax,
                     float* col_amax) {
  __shared__ int col_bits[kTileRows][kTile];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  float cm = 0.f;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const int64_t row = rt * kTile + r;
      float a = 0.f;
      if (row < rows && col < cols) a = fabsf(load(x, row * cols + col));
      cm = keep_max(cm, a);
      int bits = __float_as_int(a);  // the warp is one tile row: reduce over its columns
      for (int o = 16; o > 0; o /= 2) bits = max(bits, __shfl_xor_sync(0xffffffff, bits, o));
      if (threadIdx.x == 0 && row < rows) atomicMax(reinterpret_cast<int*>(row_amax + row), bits);
    }
  }
  col_bits[threadIdx.y][threadIdx.x] = __float_as_int(cm);
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    int bits = col_bits[0][threadIdx.x];
    for (int y = 1; y < kTileRows; ++y) bits = max(bits, col_bits[y][threadIdx.x]);
    atomicMax(reinterpret_cast<int*>(col_amax + col), bits);
  }
}

dim3 tile_grid(int64_t rows, int64_t cols) {
  return dim3(static_cast<unsigned>((cols + kTile - 1) / kTile),
              static_cast<unsigned>(std::min<int64_t>((rows + kTile - 1) / kTile, 65535)));
}

template <typename T>
int amax_as(const void* x, int64_t n, float* amax, cudaStream_t stream) {
  cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(float), stream);
  if (e != cudaSuccess) return e;
  if (n == 0) return 0;
  const int64_t want = (n + kAmaxThreads * 8 - 1) / (kAmaxThreads * 8);  // ~8 elements per thread
  const int blocks = static_cast<int>(std::min<int64_t>(std::max<int64_t>(want, 1), 4096));
  amax_kernel<T><<<blocks, kAmaxThreads, 0, stream>>>(static_cast<const T*>(x), n, amax);
  return cudaGetLastError();
}

template <typename T>
int cast_as(const void* x, int64_t rows, int64_t cols, bool e5m2, const float* amax, void* q,
            void* qt, float* inverse, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return 0;
  cast_kernel<T, false><<<tile_grid(rows, cols), dim3(kTile, kTileRows), 0, stream>>>(
      static_cast<const T*>(x), rows, cols, e5m2, amax, nullptr,
      static_cast<__nv_fp8_storage_t*>(q), static_cast<__nv_fp8_storage_t*>(qt), inverse, nullptr);
  return cudaGetLastError();
}

template <typename T>
int amax_axes_as(const void* x, int64_t rows, int64_t cols, float* row_amax, float* col_amax,
                 cudaStream_t stream) {
  cudaError_t e = cudaMemsetAsync(row_amax, 0, sizeof(float) * rows, stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(col_amax, 0, sizeof(float) * cols, stream);
  if (e != cudaSuccess) return e;
  if (rows == 0 || cols == 0) return 0;
  amax_axes_kernel<T><<<tile_grid(rows, cols), dim3(kTile, kTileRows), 0, stream>>>(
      static_cast<const T*>(x), rows, cols, row_amax, col_amax);
  return cudaGetLastError();
}

template <typename T>
int cast_axes_as(const void* x, int64_t rows, int64_t cols, bool e5m2, const float* row_amax,
                 const float* col_amax, void* q, void* qt, float* row_inverse, float* col_inverse,
                 cudaStream_t stream) {
  if (rows == 0 || cols == 0) return 0;
  cast_kernel<T, true><<<tile_grid(rows, cols), dim3(kTile, kTileRows), 0, stream>>>(
      static_cast<const T*>(x), rows, cols, e5m2, row_amax, col_amax,
      static_cast<__nv_fp8_storage_t*>(q), static_cast<__nv_fp8_storage_t*>(qt), row_inverse,
      col_inverse);
  return cudaGetLastError();
}

}  // namespace

int fp8_amax(const void* x, int64_t n, Fp8Source type, float* amax, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case Fp8Source::kFloat32:
      return amax_as<float>(x, n, amax, s);
    case Fp8Source::kBFloat16:
      return amax_as<__nv_bfloat16>(x, n, amax, s);
    case Fp8Source::kFloat16:
      return amax_as<__half>(x, n, amax, s);
  }
  return cudaErrorInvalidValue;
}

int fp8_cast(const void* x, int64_t rows, int64_t cols, Fp8Source type, bool e5m2,
             const float* amax, void* q, void* qt, float* inverse, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case Fp8Source::kFloat32:
      return cast_as<float>(x, rows, cols, e5m2, amax, q, qt, inverse, s);
    case Fp8Source::kBFloat16:
      return cast_as<__nv_bfloat16>(x, rows, cols, e5m2, amax, q, qt, inverse, s);
    case Fp8Source::kFloat16:
      return cast_as<__half>(x, rows, cols, e5m2, amax, q, qt, inverse, s);
  }
  return cudaErrorInvalidValue;
}

int fp8_amax_axes(const void* x, int64_t rows, int64_t cols, Fp8Source type, float* row_amax,
                  float* col_amax, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case Fp8Source::kFloat32:
      return amax_axes_as<float>(x, rows, cols, row_amax, col_amax, s);
    case Fp8Source::kBFloat16:
      return amax_axes_as<__nv_bfloat16>(x, rows, cols, row_amax, col_amax, s);
    case Fp8Source::kFloat16:
      return amax_axes_as<__half>(x, rows, cols, row_amax, col_amax, s);
  }
  return cudaErrorInvalidValue;
}

int fp8_cast_axes(const void* x, int64_t rows, int64_t cols, Fp8Source type, bool e5m2,
                  const float* row_amax, const float* col_amax, void* q, void* qt,
                  float* row_inverse, float* col_inverse, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case Fp8Source::kFloat32:
      return cast_axes_as<float>(x, rows, cols, e5m2, row_amax, col_amax, q, qt, row_inverse,
                                 col_inverse, s);
    case Fp8Source::kBFloat16:
      return cast_axes_as<__nv_bfloat16>(x, rows, cols, e5m2, row_amax, col_amax, q, qt,
                                         row_inverse, col_inverse, s);
    case Fp8Source::kFloat16:
      return cast_axes_as<__half>(x, rows, cols, e5m2, row_amax, col_amax, q, qt, row_inverse,
                                  col_inverse, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fabric::kernels
