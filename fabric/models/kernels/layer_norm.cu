// LayerNorm (and RMSNorm: kRms, no mean and no bias) over float32 rows with a 16-bit output, fused
// with the residual add before it, and its backward with the residual gradient added and
// deterministic weight/bias gradients. One warp per row; the row is read from memory again (from
// L1/L2) instead of kept in registers, so any width that is a multiple of 4 works.
#include "fabric/models/kernels/layer_norm.h"

#include "fabric/models/kernels/convert.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "fabric/nn/kernels/fp8_common.cuh"  // after the CUDA headers: it uses their __device__

#include <algorithm>
#include <cstdint>

namespace fabric::kernels {
namespace {

constexpr int kWarps = 4;  // forward: rows per block
constexpr int kThreads = 32 * kWarps;
constexpr int kBwdWarps = 8;  // backward: warps per block, each with its own weight/bias sums
constexpr int kBwdThreads = 32 * kBwdWarps;
constexpr int kBackwardBlocks = 264;  // two per SM of an H100; one partial sum of weight/bias each
constexpr int kReduceGroups = 8;      // ln_backward_reduce: threads per column

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}

template <typename T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

// kRms: mean is taken as 0 (pass 2 folds into pass 1), no bias, mean_out not written.
// kFp8: y is not written; each output value, rounded to T as y would hold it, is scaled by the
// history's scale and written to f8.q as float8 e4m3 (fp8_cast.cu's cast of y: the same bytes),
// its magnitude taken into f8.record (layer_norm.h). kAmax (without kFp8): y written, and its
// largest magnitude as it holds it taken into f8.record.
template <typename T, bool kRms, bool kFp8, bool kAmax = false>
__global__ void __launch_bounds__(kThreads)
    ln_forward(const float* __restrict__ x, const T* __restrict__ delta, float* __restrict__ h,
               const float* __restrict__ weight, const float* __restrict__ bias, T* __restrict__ y,
               float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows,
               int64_t cols, float eps, LayerNormFp8Out f8) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  float scale = 0.f, seen = 0.f;  // kFp8: the history's scale; the largest |value| written
  if constexpr (kFp8) {
    scale = fp8_history_scale<kThreads>(f8.history, f8.history_len, 448.f);
    if (f8.inverse != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *f8.inverse = 1.f / scale;
  }
  if (row < rows) {
    const int64_t n4 = cols / 4;
    const float4* xr = reinterpret_cast<const float4*>(x + row * cols);
    const Pack4<T>* dr = delta ? reinterpret_cast<const Pack4<T>*>(delta + row * cols) : nullptr;
    float4* hr = reinterpret_cast<float4*>(h + row * cols);
    const float4* src = delta ? reinterpret_cast<const float4*>(hr) : xr;  // where h lives
    // Pass 1: h = x + delta, the sum (RMSNorm: the sum of squares).
    float sum = 0.f;
    for (int64_t i = lane; i < n4; i += 32) {
      float4 v = xr[i];
      if (dr) {
        const Pack4<T> d = dr[i];
        v.x += to_float(d.v[0]);
        v.y += to_float(d.v[1]);
        v.z += to_float(d.v[2]);
        v.w += to_float(d.v[3]);
        hr[i] = v;
      }
      sum += kRms ? (v.x * v.x + v.y * v.y) + (v.z * v.z + v.w * v.w) : (v.x + v.y) + (v.z + v.w);
    }
    const float mean = kRms ? 0.f : warp_sum(sum) / static_cast<float>(cols);
    // Pass 2: the variance about the mean.
    float sq = sum;
    if (!kRms) {
      sq = 0.f;
      for (int64_t i = lane; i < n4; i += 32) {
        const float4 v = src[i];
        const float a = v.x - mean, b = v.y - mean, c = v.z - mean, d = v.w - mean;
        sq += (a * a + b * b) + (c * c + d * d);
      }
    }
    const float rstd = rsqrtf(warp_sum(sq) / static_cast<float>(cols) + eps);
    if (lane == 0) {
      if (!kRms) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    // Pass 3: y (kFp8: its float8 bytes).
    const float4* w4 = reinterpret_cast<const float4*>(weight);
    const float4* b4 = reinterpret_cast<const float4*>(bias);
    Pack4<T>* yr = kFp8 ? nullptr : reinterpret_cast<Pack4<T>*>(y + row * cols);
    uint32_t* qr = kFp8 ? reinterpret_cast<uint32_t*>(f8.q + row * cols) : nullptr;
    for (int64_t i = lane; i < n4; i += 32) {
      const float4 v = src[i], w = w4[i];
      Pack4<T> o;
      if (kRms) {  // weight · (h · rstd): the ATen formula's order (fabric/models/llama.cc)
        o.v[0] = from_float<T>(w.x * (v.x * rstd));
        o.v[1] = from_float<T>(w.y * (v.y * rstd));
        o.v[2] = from_float<T>(w.z * (v.z * rstd));
        o.v[3] = from_float<T>(w.w * (v.w * rstd));
      } else {
        const float4 b = b4[i];
        o.v[0] = from_float<T>((v.x - mean) * rstd * w.x + b.x);
        o.v[1] = from_float<T>((v.y - mean) * rstd * w.y + b.y);
        o.v[2] = from_float<T>((v.z - mean) * rstd * w.z + b.z);
        o.v[3] = from_float<T>((v.w - mean) * rstd * w.w + b.w);
      }
      if constexpr (kFp8) {
        float r[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          r[k] = to_float(o.v[k]);
          seen = fp8_keep_max(seen, fabsf(r[k]));
        }
        qr[i] = fp8_cvt2(r[0] * scale, r[1] * scale, __NV_E4M3) |
                (fp8_cvt2(r[2] * scale, r[3] * scale, __NV_E4M3) << 16);
        continue;
      }
      yr[i] = o;
      if constexpr (kAmax) {
#pragma unroll
        for (int k = 0; k < 4; ++k) seen = fp8_keep_max(seen, fabsf(to_float(o.v[k])));
      }
    }
  }
  if constexpr (kFp8 || kAmax) {
    if (f8.record != nullptr) fp8_block_max_into<kThreads>(seen, f8.record);
  }
}

// Each block's warps take rows blockIdx.x * kWarps + warp, then every gridDim.x * kWarps-th; each
// warp sums dweight/dbias of its rows in its own shared-memory row, the block adds its warps' in
// order into partial[blockIdx.x], and ln_backward_reduce adds the blocks' in order. kRms: the mean
// is 0 (mean_in not read), the gradient has no mean term (s1) and there is no dbias, so a warp
// keeps cols sums, not 2 cols.
template <typename T, bool kRms>
__global__ void __launch_bounds__(kBwdThreads)
    ln_backward(const T* __restrict__ dy, const float* __restrict__ h,
                const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                const float* __restrict__ weight, const float* __restrict__ dh_in,
                float* __restrict__ dh, T* __restrict__ dh16, float* __restrict__ partial,
                int64_t rows, int64_t cols) {
  constexpr int kSums = kRms ? 1 : 2;
  extern __shared__ float smem[];  // [kBwdWarps][kSums][cols]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float* dw_acc = smem + static_cast<int64_t>(warp) * kSums * cols;
  float* db_acc = dw_acc + cols;  // LayerNorm only
  for (int64_t j = lane; j < cols; j += 32) {
    dw_acc[j] = 0.f;
    if (!kRms) db_acc[j] = 0.f;
  }
  // Lane l zeroed columns l, l + 32, ...; it accumulates columns 4l .. 4l + 3 below: another
  // lane's. A warp's lanes need not run in step (independent thread scheduling, sm_70+).
  __syncwarp();
  const int64_t n4 = cols / 4;
  const float inv_cols = 1.f / static_cast<float>(cols);
  const float4* w4 = reinterpret_cast<const float4*>(weight);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kBwdWarps + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kBwdWarps) {
    const float mean = kRms ? 0.f : mean_in[row], rstd = rstd_in[row];
    const float4* hr = reinterpret_cast<const float4*>(h + row * cols);
    const Pack4<T>* gr = reinterpret_cast<const Pack4<T>*>(dy + row * cols);
    float s1 = 0.f, s2 = 0.f;
    for (int64_t i = lane; i < n4; i += 32) {
      const float4 v = hr[i], w = w4[i];
      const Pack4<T> g = gr[i];
      const float hv[4] = {v.x, v.y, v.z, v.w}, wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float gy = to_float(g.v[k]);
        const float xhat = (hv[k] - mean) * rstd;
        const float gx = gy * wv[k];
        s1 += gx;
        s2 += gx * xhat;
        dw_acc[4 * i + k] += gy * xhat;
        if (!kRms) db_acc[4 * i + k] += gy;
      }
    }
    s1 = kRms ? 0.f : warp_sum(s1) * inv_cols;
    s2 = warp_sum(s2) * inv_cols;
    const float4* dir = dh_in ? reinterpret_cast<const float4*>(dh_in + row * cols) : nullptr;
    float4* dr = reinterpret_cast<float4*>(dh + row * cols);
    Pack4<T>* d16 = dh16 ? reinterpret_cast<Pack4<T>*>(dh16 + row * cols) : nullptr;
    for (int64_t i = lane; i < n4; i += 32) {
      const float4 v = hr[i], w = w4[i];
      const Pack4<T> g = gr[i];
      const float hv[4] = {v.x, v.y, v.z, v.w}, wv[4] = {w.x, w.y, w.z, w.w};
      float out[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float xhat = (hv[k] - mean) * rstd;
        out[k] = rstd * (to_float(g.v[k]) * wv[k] - s1 - xhat * s2);
      }
      float4 o{out[0], out[1], out[2], out[3]};
      if (dir) {
        const float4 a = dir[i];
        o.x += a.x;
        o.y += a.y;
        o.z += a.z;
        o.w += a.w;
      }
      dr[i] = o;
      if (d16) {
        Pack4<T> p;
        p.v[0] = from_float<T>(o.x);
        p.v[1] = from_float<T>(o.y);
        p.v[2] = from_float<T>(o.z);
        p.v[3] = from_float<T>(o.w);
        d16[i] = p;
      }
    }
  }
  __syncthreads();
  float* out = partial + static_cast<int64_t>(blockIdx.x) * kSums * cols;
  for (int64_t j = threadIdx.x; j < kSums * cols; j += kBwdThreads) {
    float s = 0.f;
    for (int w = 0; w < kBwdWarps; ++w) s += smem[static_cast<int64_t>(w) * kSums * cols + j];
    out[j] = s;
  }
}

// 32 columns per block, kReduceGroups threads per column, each summing every kReduceGroups-th
// block's partial; the groups' sums are then added in order: a fixed order, so deterministic.
// A partial row holds `sums` · cols values: dweight's, then (sums 2) dbias's.
__global__ void __launch_bounds__(32 * kReduceGroups)
    ln_backward_reduce(const float* __restrict__ partial, int blocks, int64_t cols, int sums_per,
                       float* __restrict__ dweight, float* __restrict__ dbias) {
  __shared__ float sums[kReduceGroups][32];
  const int c = threadIdx.x % 32, g = threadIdx.x / 32;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + c;
  const int64_t width = sums_per * cols;
  float s = 0.f;
  if (j < width)
    for (int b = g; b < blocks; b += kReduceGroups)
      s += partial[static_cast<int64_t>(b) * width + j];
  sums[g][c] = s;
  __syncthreads();
  if (g == 0 && j < width) {
    float total = 0.f;
    for (int k = 0; k < kReduceGroups; ++k) total += sums[k][c];
    if (j < cols) {
      dweight[j] = total;
    } else {
      dbias[j - cols] = total;
    }
  }
}

int backward_blocks(int64_t rows) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(kBackwardBlocks, (rows + kBwdWarps - 1) / kBwdWarps)));
}

// f8.q not null: y as float8 (ln_forward's kFp8); else f8.record not null: y and its amax (kAmax).
template <typename T, bool kRms>
cudaError_t forward(const float* x, const void* delta, float* h, const float* weight,
                    const float* bias, void* y, float* mean, float* rstd, int64_t rows,
                    int64_t cols, float eps, cudaStream_t stream, const LayerNormFp8Out& f8 = {}) {
  if (f8.q != nullptr && (f8.history == nullptr || f8.history_len < 1))
    return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  const T* d = static_cast<const T*>(delta);
  if (f8.q != nullptr)
    ln_forward<T, kRms, true><<<blocks, kThreads, 0, stream>>>(x, d, h, weight, bias, nullptr, mean,
                                                               rstd, rows, cols, eps, f8);
  else if (f8.record != nullptr)
    ln_forward<T, kRms, false, true><<<blocks, kThreads, 0, stream>>>(
        x, d, h, weight, bias, static_cast<T*>(y), mean, rstd, rows, cols, eps, f8);
  else
    ln_forward<T, kRms, false><<<blocks, kThreads, 0, stream>>>(
        x, d, h, weight, bias, static_cast<T*>(y), mean, rstd, rows, cols, eps, f8);
  return cudaGetLastError();
}

template <typename T, bool kRms>
cudaError_t backward(const void* dy, const float* h, const float* mean, const float* rstd,
                     const float* weight, const float* dh_in, float* dh, void* dh16, float* dweight,
                     float* dbias, float* workspace, int64_t rows, int64_t cols,
                     cudaStream_t stream) {
  const int blocks = backward_blocks(rows);
  const auto smem = static_cast<size_t>(layer_norm_backward_shared_bytes(cols, kRms));
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(
        ln_backward<T, kRms>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  ln_backward<T, kRms><<<blocks, kBwdThreads, smem, stream>>>(
      static_cast<const T*>(dy), h, mean, rstd, weight, dh_in, dh, static_cast<T*>(dh16), workspace,
      rows, cols);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  constexpr int kSums = kRms ? 1 : 2;
  const auto reduce_blocks = static_cast<unsigned>((kSums * cols + 31) / 32);
  ln_backward_reduce<<<reduce_blocks, 32 * kReduceGroups, 0, stream>>>(workspace, blocks, cols,
                                                                       kSums, dweight, dbias);
  return cudaGetLastError();
}

}  // namespace

int layer_norm_forward(const float* x, const void* delta, float* h, const float* weight,
                       const float* bias, void* y, float* mean, float* rstd, int64_t rows,
                       int64_t cols, float eps, LogitType type, void* stream,
                       const LayerNormFp8Out& f8) {
  const auto s = static_cast<cudaStream_t>(stream);
  return static_cast<int>(type == LogitType::kBFloat16
                              ? forward<__nv_bfloat16, false>(x, delta, h, weight, bias, y, mean,
                                                              rstd, rows, cols, eps, s, f8)
                              : forward<__half, false>(x, delta, h, weight, bias, y, mean, rstd,
                                                       rows, cols, eps, s, f8));
}

int layer_norm_backward(const void* dy, const float* h, const float* mean, const float* rstd,
                        const float* weight, const float* dh_in, float* dh, void* dh16,
                        float* dweight, float* dbias, float* workspace, int64_t rows, int64_t cols,
                        LogitType type, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return static_cast<int>(type == LogitType::kBFloat16
                              ? backward<__nv_bfloat16, false>(dy, h, mean, rstd, weight, dh_in, dh,
                                                               dh16, dweight, dbias, workspace,
                                                               rows, cols, s)
                              : backward<__half, false>(dy, h, mean, rstd, weight, dh_in, dh, dh16,
                                                        dweight, dbias, workspace, rows, cols, s));
}

int rms_norm_forward(const float* x, const void* delta, float* h, const float* weight, void* y,
                     float* rstd, int64_t rows, int64_t cols, float eps, LogitType type,
                     void* stream, const LayerNormFp8Out& f8) {
  const auto s = static_cast<cudaStream_t>(stream);
  return static_cast<int>(type == LogitType::kBFloat16
                              ? forward<__nv_bfloat16, true>(x, delta, h, weight, nullptr, y,
                                                             nullptr, rstd, rows, cols, eps, s, f8)
                              : forward<__half, true>(x, delta, h, weight, nullptr, y, nullptr,
                                                      rstd, rows, cols, eps, s, f8));
}

int rms_norm_backward(const void* dy, const float* h, const float* rstd, const float* weight,
                      const float* dh_in, float* dh, void* dh16, float* dweight, float* workspace,
                      int64_t rows, int64_t cols, LogitType type, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return static_cast<int>(
      type == LogitType::kBFloat16
          ? backward<__nv_bfloat16, true>(dy, h, nullptr, rstd, weight, dh_in, dh, dh16, dweight,
                                          nullptr, workspace, rows, cols, s)
          : backward<__half, true>(dy, h, nullptr, rstd, weight, dh_in, dh, dh16, dweight, nullptr,
                                   workspace, rows, cols, s));
}

int64_t layer_norm_backward_shared_bytes(int64_t cols, bool rms) {
  return static_cast<int64_t>(sizeof(float)) * (rms ? 1 : 2) * cols * kBwdWarps;
}

int64_t layer_norm_workspace_floats(int64_t rows, int64_t cols) {
  return static_cast<int64_t>(backward_blocks(rows)) * 2 * cols;
}

}  // namespace fabric::kernels
