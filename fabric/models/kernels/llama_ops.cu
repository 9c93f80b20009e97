// The Llama family's elementwise steps as single kernels (llama_ops.h): the rotary embedding of
// the queries and keys (forward and backward) and SwiGLU's silu(gate) · up (forward and
// backward). Each replaces a chain of ATen operators that each read and write the whole tensor;
// each rounds to 16 bits exactly where those operators' outputs are rounded. Bandwidth-bound:
// every thread moves 4 values of each operand at once (8-byte loads) in a grid-stride loop.
#include "fabric/models/kernels/llama_ops.h"

#include "fabric/models/kernels/convert.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fabric/nn/kernels/activations.cuh"  // after the CUDA headers: it uses their __device__

#include <algorithm>
#include <cstdint>

namespace fabric::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 65535;
constexpr int kVec = 4;

template <typename T>
struct alignas(kVec * sizeof(T)) Pack {
  T v[kVec];
};

template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

unsigned blocks_for(int64_t work) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(kMaxBlocks, (work + kThreads - 1) / kThreads)));
}

// One thread: row (b, h, t) and columns c .. c + 3 of the first half with their partners
// c + D/2 .. c + D/2 + 3. Forward: y_lo = x_lo·cos_lo − x_hi·sin_lo, y_hi = x_hi·cos_hi +
// x_lo·sin_hi in float32 (ATen's mul, neg, cat, mul and add on a 16-bit x and float32 angles:
// float32 products and sum, no fused multiply-add), rounded once to T (autocast's cast before the
// attention). Backward, from the attention's 16-bit gradient: y_lo = x_lo·cos_lo + x_hi·sin_hi,
// y_hi = x_hi·cos_hi − x_lo·sin_lo, each product rounded to T (autograd casts each gradient to
// x's dtype before it sums them) and the sum too.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    rotary_kernel(const T* __restrict__ x, RotaryStrides xs, T* __restrict__ y, RotaryStrides ys,
                  const float* __restrict__ cos, const float* __restrict__ sin, int64_t heads,
                  int64_t seq, int64_t dim, int64_t rows, bool backward) {
  const int64_t half = dim / 2, groups = half / kVec;
  const int64_t total = rows * groups;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t row = i / groups, c = (i % groups) * kVec;
    const int64_t t = row % seq, h = (row / seq) % heads, b = row / (seq * heads);
    const T* xr = x + b * xs.b + h * xs.h + t * xs.t;
    T* yr = y + b * ys.b + h * ys.h + t * ys.t;
    const float* cr = cos + t * dim;
    const float* sr = sin + t * dim;
    const Pack<T> xl = *reinterpret_cast<const Pack<T>*>(xr + c);
    const Pack<T> xh = *reinterpret_cast<const Pack<T>*>(xr + c + half);
    const float4 cl = *reinterpret_cast<const float4*>(cr + c);
    const float4 ch = *reinterpret_cast<const float4*>(cr + c + half);
    const float4 sl = *reinterpret_cast<const float4*>(sr + c);
    const float4 sh = *reinterpret_cast<const float4*>(sr + c + half);
    const float c_lo[kVec] = {cl.x, cl.y, cl.z, cl.w}, c_hi[kVec] = {ch.x, ch.y, ch.z, ch.w};
    const float s_lo[kVec] = {sl.x, sl.y, sl.z, sl.w}, s_hi[kVec] = {sh.x, sh.y, sh.z, sh.w};
    Pack<T> yl, yh;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float lo = to_float(xl.v[k]), hi = to_float(xh.v[k]);
      if (!backward) {
        // x · cos + rotate_half(x) · sin, rotate_half(x) = [-x_hi, x_lo].
        yl.v[k] = from_float<T>(__fadd_rn(__fmul_rn(lo, c_lo[k]), __fmul_rn(-hi, s_lo[k])));
        yh.v[k] = from_float<T>(__fadd_rn(__fmul_rn(hi, c_hi[k]), __fmul_rn(lo, s_hi[k])));
      } else {
        // x · cos + rotate_half's transpose of v = x · sin: [v_hi, -v_lo].
        const float a_lo = round_to<T>(lo * c_lo[k]), a_hi = round_to<T>(hi * c_hi[k]);
        const float v_lo = round_to<T>(lo * s_lo[k]), v_hi = round_to<T>(hi * s_hi[k]);
        yl.v[k] = from_float<T>(a_lo + v_hi);
        yh.v[k] = from_float<T>(a_hi - v_lo);
      }
    }
    *reinterpret_cast<Pack<T>*>(yr + c) = yl;
    *reinterpret_cast<Pack<T>*>(yr + c + half) = yh;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    swiglu_forward_kernel(const T* __restrict__ gate, const T* __restrict__ up, T* __restrict__ y,
                          int64_t n) {
  const int64_t vectors = n / kVec;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < vectors;
       i += stride) {
    const Pack<T> g = reinterpret_cast<const Pack<T>*>(gate)[i];
    const Pack<T> u = reinterpret_cast<const Pack<T>*>(up)[i];
    Pack<T> o;
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      o.v[k] = from_float<T>(round_to<T>(silu(to_float(g.v[k]))) * to_float(u.v[k]));
    reinterpret_cast<Pack<T>*>(y)[i] = o;
  }
  for (int64_t i = vectors * kVec + static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < n; i += stride)
    y[i] = from_float<T>(round_to<T>(silu(to_float(gate[i]))) * to_float(up[i]));
}

// dgate = silu_backward(round(dy · up), gate), dup = round(dy · round(silu(gate))); silu and its
// gradient as ATen's (activations.cuh, which fp8_cast.cu's fused casts of them share).
template <typename T>
__device__ __forceinline__ void swiglu_grad(float dy, float g, float u, T* dgate, T* dup) {
  *dgate = from_float<T>(silu_grad(round_to<T>(dy * u), g));
  *dup = from_float<T>(dy * round_to<T>(silu(g)));
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    swiglu_backward_kernel(const T* __restrict__ dy, const T* __restrict__ gate,
                           const T* __restrict__ up, T* __restrict__ dgate, T* __restrict__ dup,
                           int64_t n) {
  const int64_t vectors = n / kVec;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < vectors;
       i += stride) {
    const Pack<T> d = reinterpret_cast<const Pack<T>*>(dy)[i];
    const Pack<T> g = reinterpret_cast<const Pack<T>*>(gate)[i];
    const Pack<T> u = reinterpret_cast<const Pack<T>*>(up)[i];
    Pack<T> dg, du;
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      swiglu_grad(to_float(d.v[k]), to_float(g.v[k]), to_float(u.v[k]), &dg.v[k], &du.v[k]);
    reinterpret_cast<Pack<T>*>(dgate)[i] = dg;
    reinterpret_cast<Pack<T>*>(dup)[i] = du;
  }
  for (int64_t i = vectors * kVec + static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
       i < n; i += stride)
    swiglu_grad(to_float(dy[i]), to_float(gate[i]), to_float(up[i]), &dgate[i], &dup[i]);
}

template <typename T>
cudaError_t rotary_t(const void* x, RotaryStrides xs, void* y, RotaryStrides ys, const float* cos,
                     const float* sin, int64_t batch, int64_t heads, int64_t seq, int64_t dim,
                     bool backward, cudaStream_t stream) {
  const int64_t rows = batch * heads * seq;
  if (rows == 0) return cudaSuccess;
  if (dim % (2 * kVec) != 0) return cudaErrorInvalidValue;
  rotary_kernel<T><<<blocks_for(rows * (dim / 2 / kVec)), kThreads, 0, stream>>>(
      static_cast<const T*>(x), xs, static_cast<T*>(y), ys, cos, sin, heads, seq, dim, rows,
      backward);
  return cudaGetLastError();
}

template <typename T>
cudaError_t swiglu_forward_t(const void* gate, const void* up, void* y, int64_t n,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  swiglu_forward_kernel<T><<<blocks_for((n + kVec - 1) / kVec), kThreads, 0, stream>>>(
      static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(y), n);
  return cudaGetLastError();
}

template <typename T>
cudaError_t swiglu_backward_t(const void* dy, const void* gate, const void* up, void* dgate,
                              void* dup, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  swiglu_backward_kernel<T><<<blocks_for((n + kVec - 1) / kVec), kThreads, 0, stream>>>(
      static_cast<const T*>(dy), static_cast<const T*>(gate), static_cast<const T*>(up),
      static_cast<T*>(dgate), static_cast<T*>(dup), n);
  return cudaGetLastError();
}

}  // namespace

int rotary(const void* x, RotaryStrides xs, void* y, RotaryStrides ys, const float* cos,
           const float* sin, int64_t batch, int64_t heads, int64_t seq, int64_t dim, bool backward,
           LogitType type, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return static_cast<int>(
      type == LogitType::kBFloat16
          ? rotary_t<__nv_bfloat16>(x, xs, y, ys, cos, sin, batch, heads, seq, dim, backward, s)
          : rotary_t<__half>(x, xs, y, ys, cos, sin, batch, heads, seq, dim, backward, s));
}

int swiglu_forward(const void* gate, const void* up, void* y, int64_t n, LogitType type,
                   void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return static_cast<int>(type == LogitType::kBFloat16
                              ? swiglu_forward_t<__nv_bfloat16>(gate, up, y, n, s)
                              : swiglu_forward_t<__half>(gate, up, y, n, s));
}

int swiglu_backward(const void* dy, const void* gate, const void* up, void* dgate, void* dup,
                    int64_t n, LogitType type, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  return static_cast<int>(type == LogitType::kBFloat16
                              ? swiglu_backward_t<__nv_bfloat16>(dy, gate, up, dgate, dup, n, s)
                              : swiglu_backward_t<__half>(dy, gate, up, dgate, dup, n, s));
}

}  // namespace fabric::kernels
