// Float8 quantization for fabric/nn/fp8_quantize.cc: the largest magnitude of a tensor (one read,
// one atomic per block), then the scaled, saturated cast written row-major and transposed from one
// read through a shared-memory tile (_scaled_mm wants the backward's operands column-major).
// Bandwidth-bound: every thread moves 8 elements at a time (16-byte loads of 16-bit inputs,
// 8-byte stores of float8), so the kernels need 16-byte-aligned inputs whose rows and columns
// are multiples of 8 (fp8_gemm.cc's GEMMs need multiples of 16).
#include "fabric/nn/kernels/fp8_cast.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "fabric/nn/kernels/activations.cuh"  // after the CUDA headers: it uses their __device__
#include "fabric/nn/kernels/fp8_common.cuh"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

namespace fabric::kernels {
namespace {

constexpr int kVec = 8;  // elements a thread moves at once
constexpr int kAmaxThreads = 256;
constexpr int kTile = 64;  // tiled kernels: a kTile × kTile tile per block
static_assert(kTile == kFp8SumRows, "col_sums are per tile of rows (fp8_cast.h)");
constexpr int kTileThreads = 256;
constexpr int kGroups = kTile / kVec;             // vectors per tile row (8)
constexpr int kRowStep = kTileThreads / kGroups;  // tile rows one pass of the block covers (32)
constexpr int kPasses = kTile / kRowStep;         // passes per tile (2)
constexpr int kTileStride = kTile + 4;  // bytes per shared tile row: 4-byte stores, and the
                                        // transposing reads of 8 rows fall in 4 banks

__device__ __forceinline__ float load(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float load(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ float load(const __half* p, int64_t i) { return __half2float(p[i]); }

// 8 elements of T as a 16-byte-aligned load brings them (fetch8), before they are widened to
// float32 (unpack8): the tiled cast fetches its next tile's vectors while it works on this one's.
template <typename T>
struct Raw8 {
  uint4 u;  // 8 16-bit values
};
template <>
struct Raw8<float> {
  float4 a, b;
};
__device__ __forceinline__ void fetch8(const float* p, Raw8<float>& r) {
  r.a = *reinterpret_cast<const float4*>(p);
  r.b = *reinterpret_cast<const float4*>(p + 4);
}
template <typename T>
__device__ __forceinline__ void fetch8(const T* p, Raw8<T>& r) {
  r.u = *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void unpack8(const Raw8<float>& r, float v[kVec]) {
  v[0] = r.a.x, v[1] = r.a.y, v[2] = r.a.z, v[3] = r.a.w;
  v[4] = r.b.x, v[5] = r.b.y, v[6] = r.b.z, v[7] = r.b.w;
}
__device__ __forceinline__ void unpack8(const Raw8<__nv_bfloat16>& r, float v[kVec]) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&r.u);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void unpack8(const Raw8<__half>& r, float v[kVec]) {
  const auto* h = reinterpret_cast<const __half2*>(&r.u);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    const float2 f = __half22float2(h[i]);
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}
// v[0..8) = p[0..8) as float32; p 16-byte aligned.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float v[kVec]) {
  Raw8<T> r;
  fetch8(p, r);
  unpack8(r, v);
}

__device__ __forceinline__ float round_as(float v, const float*) { return v; }
__device__ __forceinline__ float round_as(float v, const __nv_bfloat16*) {
  return __bfloat162float(__float2bfloat16(v));
}
__device__ __forceinline__ float round_as(float v, const __half*) {
  return __half2float(__float2half(v));
}

// How many operands besides x an op reads (fp8_cast.h's Fp8Op); -1 for no op.
__host__ __device__ constexpr int operands_of(Fp8Op op) {
  switch (op) {
    case Fp8Op::kNone:
    case Fp8Op::kGeluTanh:
      return 0;
    case Fp8Op::kGeluTanhGrad:
    case Fp8Op::kSwiglu:
    case Fp8Op::kSwigluUpGrad:
      return 1;
    case Fp8Op::kSwigluGateGrad:
      return 2;
  }
  return -1;
}

// op's value at x with its operands' a and b (fp8_cast.h), rounded to T where the unfused
// kernels round (T: x's type, for the overload).
template <typename T>
__device__ __forceinline__ float pointwise(Fp8Op op, float x, float a, float b, const T* type) {
  switch (op) {
    case Fp8Op::kNone:
      return x;
    case Fp8Op::kGeluTanh:
      return round_as(gelu_tanh(x), type);
    case Fp8Op::kGeluTanhGrad:
      return round_as(gelu_tanh_grad(x, a), type);
    case Fp8Op::kSwiglu:
      return round_as(round_as(silu(x), type) * a, type);
    case Fp8Op::kSwigluGateGrad:
      return round_as(silu_grad(round_as(x * b, type), a), type);
    case Fp8Op::kSwigluUpGrad:
      return round_as(x * round_as(silu(a), type), type);
  }
  return x;
}
template <typename T>
__device__ __forceinline__ void pointwise8(Fp8Op op, float v[kVec], const float a[kVec],
                                           const float b[kVec], const T* type) {
#pragma unroll
  for (int j = 0; j < kVec; ++j) v[j] = pointwise(op, v[j], a[j], b[j], type);
}

__device__ __forceinline__ float scale_of(float amax, float largest) {
  return largest / (amax != amax ? amax : fmaxf(amax, 1e-12f));
}

// 8 values times their scales as 8 float8 bytes in element order (little-endian).
__device__ __forceinline__ uint2 cast8(const float v[kVec], const float s[kVec],
                                       __nv_fp8_interpretation_t kind) {
  return make_uint2(
      fp8_cvt2(v[0] * s[0], v[1] * s[1], kind) | (fp8_cvt2(v[2] * s[2], v[3] * s[3], kind) << 16),
      fp8_cvt2(v[4] * s[4], v[5] * s[5], kind) | (fp8_cvt2(v[6] * s[6], v[7] * s[7], kind) << 16));
}

// *amax = the largest |x| (of kOp's values, with its operands a and b; one atomic per block).
template <typename T, Fp8Op kOp>
__global__ void __launch_bounds__(kAmaxThreads)
    amax_kernel(const T* __restrict__ x, int64_t n, float* amax, const T* __restrict__ a,
                const T* __restrict__ b) {
  float m = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t vectors = n / kVec;
  constexpr int operands = operands_of(kOp);
  for (int64_t i = first; i < vectors; i += stride) {
    float v[kVec], va[kVec] = {}, vb[kVec] = {};
    load8(x + i * kVec, v);
    if constexpr (operands > 0) load8(a + i * kVec, va);
    if constexpr (operands > 1) load8(b + i * kVec, vb);
    pointwise8(kOp, v, va, vb, x);
#pragma unroll
    for (int j = 0; j < kVec; ++j) m = fp8_keep_max(m, fabsf(v[j]));
  }
  for (int64_t i = vectors * kVec + first; i < n; i += stride) {
    const float v = pointwise(kOp, load(x, i), operands > 0 ? load(a, i) : 0.f,
                              operands > 1 ? load(b, i) : 0.f, x);
    m = fp8_keep_max(m, fabsf(v));
  }
  fp8_block_max_into<kAmaxThreads>(m, amax);
}

// amax[0], amax[1] = the largest |·| of kSwigluGateGrad's and kSwigluUpGrad's values (one
// atomic per block each).
template <typename T>
__global__ void __launch_bounds__(kAmaxThreads)
    amax_swiglu_grads_kernel(const T* __restrict__ dy, const T* __restrict__ gate,
                             const T* __restrict__ up, int64_t n, float* amax) {
  float mg = 0.f, mu = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t vectors = n / kVec;
  for (int64_t i = first; i < vectors; i += stride) {
    float d[kVec], g[kVec], u[kVec];
    load8(dy + i * kVec, d);
    load8(gate + i * kVec, g);
    load8(up + i * kVec, u);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      mg = fp8_keep_max(mg, fabsf(pointwise(Fp8Op::kSwigluGateGrad, d[j], g[j], u[j], dy)));
      mu = fp8_keep_max(mu, fabsf(pointwise(Fp8Op::kSwigluUpGrad, d[j], g[j], 0.f, dy)));
    }
  }
  for (int64_t i = vectors * kVec + first; i < n; i += stride) {
    const float d = load(dy, i), g = load(gate, i);
    mg = fp8_keep_max(mg, fabsf(pointwise(Fp8Op::kSwigluGateGrad, d, g, load(up, i), dy)));
    mu = fp8_keep_max(mu, fabsf(pointwise(Fp8Op::kSwigluUpGrad, d, g, 0.f, dy)));
  }
  fp8_block_max_into<kAmaxThreads>(mg, amax);
  __syncthreads();  // block_max_into's shared words, used again
  fp8_block_max_into<kAmaxThreads>(mu, amax + 1);
}

// Thread t of a tiled block owns vector group g = t % kGroups (tile columns 8g .. 8g + 7) of
// tile rows t / kGroups + kRowStep · p, p < kPasses.
//
// Tensorwise (kAxes false): one scale for q and qt, *row_inverse = its inverse: from row_amax[0]
// when history_len is 0, else from the history row_amax[0 .. history_len) (delayed scaling), and
// when `record` is not null x's largest |x| taken into *record (one atomic per block); when
// `col_sums` is not null, col_sums[rt · cols + c] = the float32 sum of column c over row tile rt
// (rows 64 rt .. 64 rt + 63; each thread's two rows, then the 32 thread rows in order).
// Axiswise (kAxes true): q's row r scaled by row_amax[r], qt's row c (x's column c) by
// col_amax[c]; row_inverse[r] and col_inverse[c] their inverses.
// kOp (tensorwise only): what is cast (and recorded, and summed) is kOp's value of x and its
// operands a and b (x's shape; fp8_cast.h), read with x. (A template argument: a kernel that
// switched on the op at run time would hold the registers of its costliest op, and fewer blocks.)
template <typename T, bool kAxes, Fp8Op kOp>
__global__ void __launch_bounds__(kTileThreads)
    cast_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, bool e5m2,
                const float* __restrict__ row_amax, const float* __restrict__ col_amax,
                uint8_t* __restrict__ q, uint8_t* __restrict__ qt, float* __restrict__ row_inverse,
                float* __restrict__ col_inverse, int history_len, int margin, float* record,
                float* __restrict__ col_sums, const T* __restrict__ a, const T* __restrict__ b) {
  static_assert(!(kAxes && kOp != Fp8Op::kNone), "ops are cast tensorwise only");
  constexpr int kOperands = operands_of(kOp);
  constexpr int kHeld = kOperands > 0 ? kOperands : 1;  // prefetch buffers' extent
  const float largest = e5m2 ? 57344.f : 448.f;
  const float tensor_scale =
      kAxes ? 0.f
      : history_len > 0
          ? fp8_history_scale<kTileThreads>(row_amax, history_len, ldexpf(largest, -margin))
          : scale_of(row_amax[0], largest);
  float seen = 0.f;  // the largest |x| this thread cast (delayed scaling's record)
  const __nv_fp8_interpretation_t kind = e5m2 ? __NV_E5M2 : __NV_E4M3;
  if (!kAxes && row_inverse != nullptr && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
    *row_inverse = 1.f / tensor_scale;
  __shared__ __align__(16) uint8_t tile[kTile][kTileStride];
  __shared__ float sums[kAxes ? 1 : kRowStep][kTile];  // col_sums' per-thread-row partials
  const int g = threadIdx.x % kGroups, sub = threadIdx.x / kGroups;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t col = col0 + g * kVec;
  const bool col_in = col < cols;  // cols % 8 == 0: a group is wholly inside or outside
  float col_scale[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j)
    col_scale[j] = kAxes && col_in ? scale_of(col_amax[col + j], largest) : tensor_scale;
  if (kAxes && col_inverse != nullptr && blockIdx.y == 0 && sub == 0 && col_in) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) col_inverse[col + j] = 1.f / col_scale[j];
  }
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  // A block casts every gridDim.y-th tile of its column of tiles (cast_grid: about one resident
  // wave of blocks), and each tile's loads are issued before the work on the tile before it, so
  // a load is in flight while the block converts, stores and waits at its barriers.
  Raw8<T> next[kPasses];
  Raw8<T> next_op[kHeld][kPasses];  // the operands', loaded with x's
  auto fetch_tile = [&](int64_t rt) {
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int64_t row = rt * kTile + sub + p * kRowStep;
      if (row < rows && col_in) {
        fetch8(x + row * cols + col, next[p]);
        if constexpr (kOperands > 0) fetch8(a + row * cols + col, next_op[0][p]);
        if constexpr (kOperands > 1) fetch8(b + row * cols + col, next_op[kHeld - 1][p]);
      }
    }
  };
  if (blockIdx.y < row_tiles) fetch_tile(blockIdx.y);
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t row0 = rt * kTile;
    float v[kPasses][kVec];
    float sum[kVec] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    Raw8<T> cur_op[kHeld][kPasses];  // kept packed until the next tile's loads are out
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int64_t row = row0 + sub + p * kRowStep;
      if (row < rows && col_in) {
        unpack8(next[p], v[p]);
        if constexpr (kOperands > 0) {
#pragma unroll
          for (int o = 0; o < kHeld; ++o) cur_op[o][p] = next_op[o][p];
        }
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[p][j] = 0.f;  // past the edge: read by nothing
      }
    }
    if (rt + gridDim.y < row_tiles) fetch_tile(rt + gridDim.y);
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int r = sub + p * kRowStep;
      const int64_t row = row0 + r;
      if (row >= rows || !col_in) continue;
      if constexpr (!kAxes) {
        float va[kVec] = {}, vb[kVec] = {};
        if constexpr (kOperands > 0) unpack8(cur_op[0][p], va);
        if constexpr (kOperands > 1) unpack8(cur_op[kHeld - 1][p], vb);
        pointwise8(kOp, v[p], va, vb, x);
      }
      if (!kAxes) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          seen = fp8_keep_max(seen, fabsf(v[p][j]));
          sum[j] += v[p][j];
        }
      }
      float row_scale[kVec];
      const float rs = kAxes ? scale_of(row_amax[row], largest) : tensor_scale;
#pragma unroll
      for (int j = 0; j < kVec; ++j) row_scale[j] = rs;
      if (kAxes && blockIdx.x == 0 && g == 0 && row_inverse != nullptr) row_inverse[row] = 1.f / rs;
      const uint2 vq = cast8(v[p], row_scale, kind);
      if (q != nullptr) *reinterpret_cast<uint2*>(q + row * cols + col) = vq;
      if (qt != nullptr) {
        const uint2 vt = kAxes ? cast8(v[p], col_scale, kind) : vq;
        auto* dst = reinterpret_cast<uint32_t*>(&tile[r][g * kVec]);
        dst[0] = vt.x;
        dst[1] = vt.y;
      }
    }
    if (!kAxes && col_sums != nullptr) {  // the same for every thread of the grid
#pragma unroll
      for (int j = 0; j < kVec; ++j) sums[sub][g * kVec + j] = sum[j];
      __syncthreads();
      if (threadIdx.x < kTile && col0 + threadIdx.x < cols) {
        float total = 0.f;
        for (int y = 0; y < kRowStep; ++y) total += sums[y][threadIdx.x];
        col_sums[rt * cols + col0 + threadIdx.x] = total;
      }
      __syncthreads();
    }
    if (qt == nullptr) continue;
    __syncthreads();
    // Transposed: thread t writes qt's row col0 + c (c = t / kGroups + kRowStep · p), bytes
    // row0 + 8g .. row0 + 8g + 7: a warp writes 64 contiguous bytes of 4 rows of qt.
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int c = sub + p * kRowStep;
      const int64_t tcol = col0 + c, trow = row0 + g * kVec;
      if (tcol >= cols || trow >= rows) continue;  // rows % 8 == 0: all 8 rows or none
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        lo |= static_cast<uint32_t>(tile[g * kVec + j][c]) << (8 * j);
        hi |= static_cast<uint32_t>(tile[g * kVec + 4 + j][c]) << (8 * j);
      }
      *reinterpret_cast<uint2*>(qt + tcol * rows + trow) = make_uint2(lo, hi);
    }
    __syncthreads();
  }
  if (kAxes || record == nullptr) return;  // the same for every thread of the grid
  fp8_block_max_into<kTileThreads>(seen, record);
}

// qt = q's transpose, bytes (float8 of either kind): a 64 x 64 tile through shared memory per
// step, loaded 8 bytes a thread and written as cast_kernel writes its transposed tile.
__global__ void __launch_bounds__(kTileThreads)
    transpose_kernel(const uint8_t* __restrict__ q, int64_t rows, int64_t cols,
                     uint8_t* __restrict__ qt) {
  __shared__ __align__(16) uint8_t tile[kTile][kTileStride];
  const int g = threadIdx.x % kGroups, sub = threadIdx.x / kGroups;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t row0 = rt * kTile;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int r = sub + p * kRowStep;
      const int64_t row = row0 + r, col = col0 + g * kVec;
      if (row >= rows || col >= cols) continue;  // cols % 8 == 0: a group is wholly in or out
      const uint2 v = *reinterpret_cast<const uint2*>(q + row * cols + col);
      auto* dst = reinterpret_cast<uint32_t*>(&tile[r][g * kVec]);
      dst[0] = v.x;
      dst[1] = v.y;
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int c = sub + p * kRowStep;
      const int64_t tcol = col0 + c, trow = row0 + g * kVec;
      if (tcol >= cols || trow >= rows) continue;  // rows % 8 == 0: all 8 rows or none
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        lo |= static_cast<uint32_t>(tile[g * kVec + j][c]) << (8 * j);
        hi |= static_cast<uint32_t>(tile[g * kVec + 4 + j][c]) << (8 * j);
      }
      *reinterpret_cast<uint2*>(qt + tcol * rows + trow) = make_uint2(lo, hi);
    }
    __syncthreads();
  }
}

// history[0 .. len) one place older, the recorded amax history[len] at 0, history[len] zeroed.
__global__ void push_kernel(float* history, int len) {
  for (int i = len - 1; i > 0; --i) history[i] = history[i - 1];
  history[0] = history[len];
  history[len] = 0.f;
}

// row_amax[r] = max over the row, col_amax[c] = max over the column; one atomic per row per
// tile column and one per column per block. Threads as in cast_kernel.
template <typename T>
__global__ void __launch_bounds__(kTileThreads)
    amax_axes_kernel(const T* __restrict__ x, int64_t rows, int64_t cols, float* row_amax,
                     float* col_amax) {
  __shared__ int col_bits[kRowStep][kTile];
  const int g = threadIdx.x % kGroups, sub = threadIdx.x / kGroups;
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t col = col0 + g * kVec;
  const bool col_in = col < cols;
  const int64_t row_tiles = (rows + kTile - 1) / kTile;
  float cm[kVec] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    float v[kPasses][kVec];
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int64_t row = rt * kTile + sub + p * kRowStep;
#pragma unroll
      for (int j = 0; j < kVec; ++j) v[p][j] = 0.f;
      if (row < rows && col_in) load8(x + row * cols + col, v[p]);
    }
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int64_t row = rt * kTile + sub + p * kRowStep;
      float rm = 0.f;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const float a = fabsf(v[p][j]);
        cm[j] = fp8_keep_max(cm[j], a);
        rm = fp8_keep_max(rm, a);
      }
      // The kGroups lanes of one tile row are adjacent: reduce over them (every lane takes part).
      int bits = __float_as_int(rm);
      for (int o = kGroups / 2; o > 0; o /= 2)
        bits = max(bits, __shfl_xor_sync(0xffffffff, bits, o));
      if (g == 0 && row < rows && col_in) atomicMax(reinterpret_cast<int*>(row_amax + row), bits);
    }
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) col_bits[sub][g * kVec + j] = __float_as_int(cm[j]);
  __syncthreads();
  if (threadIdx.x < kTile && col0 + threadIdx.x < cols) {
    int bits = col_bits[0][threadIdx.x];
    for (int y = 1; y < kRowStep; ++y) bits = max(bits, col_bits[y][threadIdx.x]);
    atomicMax(reinterpret_cast<int*>(col_amax + col0 + threadIdx.x), bits);
  }
}

dim3 tile_grid(int64_t rows, int64_t cols) {
  return dim3(static_cast<unsigned>((cols + kTile - 1) / kTile),
              static_cast<unsigned>(std::min<int64_t>((rows + kTile - 1) / kTile, 65535)));
}

// How many blocks of cast_kernel<T, kAxes, kOp> (kTileThreads each) the current device holds at
// once: its multiprocessors times the blocks one of them keeps resident. Cached per device and
// kernel.
template <typename T, bool kAxes, Fp8Op kOp>
int64_t resident_blocks() {
  constexpr int kDevices = 64;
  static std::atomic<int64_t> cached[kDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) return 0;
  int64_t n = cached[device].load(std::memory_order_relaxed);
  if (n > 0) return n;
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, cast_kernel<T, kAxes, kOp>,
                                                    kTileThreads, 0) != cudaSuccess) {
    (void)cudaGetLastError();  // the query's error is not the launch's
    return 0;
  }
  n = static_cast<int64_t>(sms) * std::max(per_sm, 1);
  cached[device].store(n, std::memory_order_relaxed);
  return n;
}

// The cast's grid: every column of tiles, and as many blocks down the rows as fit in one
// resident wave (never past it: a block that starts late would run its tiles alone), the row
// tiles spread evenly over them; each block then casts several tiles, its next tile's loads in
// flight while it works. With a block per tile (4096 blocks for a 16384 x 1024 operand)
// gpt2-medium's casts took 10.7 ms of an H200 step on 2026-11-30, about twice what their bytes
// take at its peak bandwidth. A block per tile when the residency is unknown (0), under
// Fp8CastGrid::kTile, and when the columns alone fill half a wave (a block walking every row
// tile of a 50,304-wide operand would be slower than many short ones).
std::atomic<int> g_cast_grid{static_cast<int>(Fp8CastGrid::kWave)};

dim3 cast_grid(int64_t rows, int64_t cols, int64_t resident) {
  dim3 grid = tile_grid(rows, cols);
  const int64_t across = grid.x, tiles = (rows + kTile - 1) / kTile;
  if (resident <= 0 || across * 2 > resident ||
      g_cast_grid.load(std::memory_order_relaxed) != static_cast<int>(Fp8CastGrid::kWave))
    return grid;
  const int64_t down = std::max<int64_t>(resident / across, 1);
  const int64_t each = (tiles + down - 1) / down;  // row tiles per block
  grid.y = static_cast<unsigned>(std::min<int64_t>((tiles + each - 1) / each, 65535));
  return grid;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The tiled kernels' preconditions (see fp8_cast.h).
bool tileable(const void* x, int64_t rows, int64_t cols) {
  return aligned16(x) && rows % kVec == 0 && cols % kVec == 0;
}

// run(std::integral_constant<Fp8Op, op>()): the kernel instantiated for the op it computes (a
// run-time switch inside would hold the registers of the costliest op in every launch).
template <typename Run>
int with_op(Fp8Op op, Run&& run) {
  using O = Fp8Op;
  switch (op) {
    case O::kGeluTanh:
      return run(std::integral_constant<O, O::kGeluTanh>());
    case O::kGeluTanhGrad:
      return run(std::integral_constant<O, O::kGeluTanhGrad>());
    case O::kSwiglu:
      return run(std::integral_constant<O, O::kSwiglu>());
    case O::kSwigluGateGrad:
      return run(std::integral_constant<O, O::kSwigluGateGrad>());
    case O::kSwigluUpGrad:
      return run(std::integral_constant<O, O::kSwigluUpGrad>());
    case O::kNone:
      break;
  }
  return run(std::integral_constant<O, O::kNone>());
}

// Whether f's operands are there (its op's, aligned): 0, or the error fp8_cast.h names.
int check_operands(const Fp8Pointwise& f) {
  const int n = operands_of(f.op);
  if (n < 0 || (n > 0 && f.a == nullptr) || (n > 1 && f.b == nullptr)) return cudaErrorInvalidValue;
  if ((n > 0 && !aligned16(f.a)) || (n > 1 && !aligned16(f.b))) return cudaErrorMisalignedAddress;
  return 0;
}

// Blocks for an amax pass over n elements: about 2 vectors per thread, at most 4096.
int amax_blocks(int64_t n) {
  const int64_t want = (n + kAmaxThreads * kVec * 2 - 1) / (kAmaxThreads * kVec * 2);
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(want, 1), 4096));
}

template <typename T>
int amax_as(const void* x, int64_t n, float* amax, cudaStream_t stream, const Fp8Pointwise& f) {
  if (!aligned16(x)) return cudaErrorMisalignedAddress;
  if (const int e = check_operands(f)) return e;
  cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(float), stream);
  if (e != cudaSuccess) return e;
  if (n == 0) return 0;
  return with_op(f.op, [&](auto op) {
    amax_kernel<T, decltype(op)::value><<<amax_blocks(n), kAmaxThreads, 0, stream>>>(
        static_cast<const T*>(x), n, amax, static_cast<const T*>(f.a), static_cast<const T*>(f.b));
    return static_cast<int>(cudaGetLastError());
  });
}

template <typename T>
int amax_swiglu_grads_as(const void* dy, const void* gate, const void* up, int64_t n, float* amax,
                         cudaStream_t stream) {
  if (!aligned16(dy) || !aligned16(gate) || !aligned16(up)) return cudaErrorMisalignedAddress;
  cudaError_t e = cudaMemsetAsync(amax, 0, 2 * sizeof(float), stream);
  if (e != cudaSuccess) return e;
  if (n == 0) return 0;
  amax_swiglu_grads_kernel<T><<<amax_blocks(n), kAmaxThreads, 0, stream>>>(
      static_cast<const T*>(dy), static_cast<const T*>(gate), static_cast<const T*>(up), n, amax);
  return cudaGetLastError();
}

template <typename T, bool kAxes, Fp8Op kOp>
int launch_cast(const void* x, int64_t rows, int64_t cols, bool e5m2, const float* row_amax,
                const float* col_amax, void* q, void* qt, float* row_inverse, float* col_inverse,
                cudaStream_t stream, int history_len, int margin, float* record, float* col_sums,
                const Fp8Pointwise& f) {
  const dim3 grid = cast_grid(rows, cols, resident_blocks<T, kAxes, kOp>());
  cast_kernel<T, kAxes, kOp><<<grid, kTileThreads, 0, stream>>>(
      static_cast<const T*>(x), rows, cols, e5m2, row_amax, col_amax, static_cast<uint8_t*>(q),
      static_cast<uint8_t*>(qt), row_inverse, col_inverse, history_len, margin, record, col_sums,
      static_cast<const T*>(f.a), static_cast<const T*>(f.b));
  return cudaGetLastError();
}

// f (tensorwise only): what is cast is f's values (fp8_cast.h).
template <typename T, bool kAxes>
int cast_as(const void* x, int64_t rows, int64_t cols, bool e5m2, const float* row_amax,
            const float* col_amax, void* q, void* qt, float* row_inverse, float* col_inverse,
            cudaStream_t stream, int history_len = 0, float* record = nullptr,
            float* col_sums = nullptr, const Fp8Pointwise& f = {}, int margin = 0) {
  if (!tileable(x, rows, cols) || history_len < 0 || margin < 0) return cudaErrorInvalidValue;
  if (kAxes && f.op != Fp8Op::kNone) return cudaErrorInvalidValue;
  if (const int e = check_operands(f)) return e;
  if (rows == 0 || cols == 0) return 0;
  auto launch = [&](auto op) {
    return launch_cast<T, kAxes, decltype(op)::value>(x, rows, cols, e5m2, row_amax, col_amax, q,
                                                      qt, row_inverse, col_inverse, stream,
                                                      history_len, margin, record, col_sums, f);
  };
  if constexpr (kAxes) {
    return launch(std::integral_constant<Fp8Op, Fp8Op::kNone>());
  } else {
    return with_op(f.op, launch);
  }
}

template <typename T>
int amax_axes_as(const void* x, int64_t rows, int64_t cols, float* row_amax, float* col_amax,
                 cudaStream_t stream) {
  if (!tileable(x, rows, cols)) return cudaErrorInvalidValue;
  cudaError_t e = cudaMemsetAsync(row_amax, 0, sizeof(float) * rows, stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(col_amax, 0, sizeof(float) * cols, stream);
  if (e != cudaSuccess) return e;
  if (rows == 0 || cols == 0) return 0;
  amax_axes_kernel<T><<<tile_grid(rows, cols), kTileThreads, 0, stream>>>(
      static_cast<const T*>(x), rows, cols, row_amax, col_amax);
  return cudaGetLastError();
}

}  // namespace

int fp8_amax(const void* x, int64_t n, Fp8Source type, float* amax, void* stream,
             const Fp8Pointwise& f) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case Fp8Source::kFloat32:
      return amax_as<float>(x, n, amax, s, f);
    case Fp8Source::kBFloat16:
      return amax_as<__nv_bfloat16>(x, n, amax, s, f);
    case Fp8Source::kFloat16:
      return amax_as<__half>(x, n, amax, s, f);
  }
  return cudaErrorInvalidValue;
}

int fp8_amax_swiglu_grads(const void* dy, const void* gate, const void* up, int64_t n,
                          Fp8Source type, float* amax, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case Fp8Source::kFloat32:
      return amax_swiglu_grads_as<float>(dy, gate, up, n, amax, s);
    case Fp8Source::kBFloat16:
      return amax_swiglu_grads_as<__nv_bfloat16>(dy, gate, up, n, amax, s);
    case Fp8Source::kFloat16:
      return amax_swiglu_grads_as<__half>(dy, gate, up, n, amax, s);
  }
  return cudaErrorInvalidValue;
}

int fp8_cast(const void* x, int64_t rows, int64_t cols, Fp8Source type, bool e5m2,
             const float* amax, void* q, void* qt, float* inverse, void* stream, float* col_sums,
             const Fp8Pointwise& f) {
  const auto s = static_cast<cudaStream_t>(stream);
  switch (type) {
    case Fp8Source::kFloat32:
      return cast_as<float, false>(x, rows, cols, e5m2, amax, nullptr, q, qt, inverse, nullptr, s,
                                   0, nullptr, col_sums, f);
    case Fp8Source::kBFloat16:
      return cast_as<__nv_bfloat16, false>(x, rows, cols, e5m2, amax, nullptr, q, qt, inverse,
                                           nullptr, s, 0, nullptr, col_sums, f);
    case Fp8Source::kFloat16:
      return cast_as<__half, false>(x, rows, cols, e5m2, amax, nullptr, q, qt, inverse, nullptr, s,
                                    0, nullptr, col_sums, f);
  }
  return cudaErrorInvalidValue;
}

int fp8_cast_delayed(const void* x, int64_t rows, int64_t cols, Fp8Source type, bool e5m2,
                     const float* history, int history_len, float* record, void* q, void* qt,
                     float* inverse, void* stream, float* col_sums, const Fp8Pointwise& f,
                     int margin) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (history_len < 1) return cudaErrorInvalidValue;
  switch (type) {
    case Fp8Source::kFloat32:
      return cast_as<float, false>(x, rows, cols, e5m2, history, nullptr, q, qt, inverse, nullptr,
                                   s, history_len, record, col_sums, f, margin);
    case Fp8Source::kBFloat16:
      return cast_as<__nv_bfloat16, false>(x, rows, cols, e5m2, history, nullptr, q, qt, inverse,
                                           nullptr, s, history_len, record, col_sums, f, margin);
    case Fp8Source::kFloat16:
      return cast_as<__half, false>(x, rows, cols, e5m2, history, nullptr, q, qt, inverse, nullptr,
                                    s, history_len, record, col_sums, f, margin);
  }
  return cudaErrorInvalidValue;
}

void fp8_set_cast_grid(Fp8CastGrid grid) {
  g_cast_grid.store(static_cast<int>(grid), std::memory_order_relaxed);
}

int fp8_history_push(float* history, int history_len, void* stream) {
  if (history_len < 1) return cudaErrorInvalidValue;
  push_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(history, history_len);
  return cudaGetLastError();
}

int fp8_transpose(const void* q, int64_t rows, int64_t cols, void* qt, void* stream) {
  if (!tileable(q, rows, cols)) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return 0;
  transpose_kernel<<<tile_grid(rows, cols), kTileThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint8_t*>(q), rows, cols, static_cast<uint8_t*>(qt));
  return cudaGetLastError();
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
      return cast_as<float, true>(x, rows, cols, e5m2, row_amax, col_amax, q, qt, row_inverse,
                                  col_inverse, s);
    case Fp8Source::kBFloat16:
      return cast_as<__nv_bfloat16, true>(x, rows, cols, e5m2, row_amax, col_amax, q, qt,
                                          row_inverse, col_inverse, s);
    case Fp8Source::kFloat16:
      return cast_as<__half, true>(x, rows, cols, e5m2, row_amax, col_amax, q, qt, row_inverse,
                                   col_inverse, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace fabric::kernels
