// Fused softmax cross-entropy over 16-bit logits: one block per row, two passes over the row (the
// second mostly from L2), float32 math, the gradient written over the logits. It replaces the
// float32 copy of the logits, the log-softmax, the loss and their backward (about 30 GB of memory
// traffic per GPT-2 step at batch 16 x 1024) with one read, one re-read and one write of the
// 16-bit logits (docs/benchmarks.md, "GPT-2 124M training step").
#include "fabric/models/kernels/cross_entropy.h"

#include "fabric/models/kernels/convert.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace fabric::kernels {
namespace {

constexpr int kThreads = 512;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Running (max, sum of 2^(x - max)) in the log2 domain; merging two is exact up to rounding.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  if (b.m == -INFINITY) return a;
  if (a.m == -INFINITY) return b;
  if (a.m < b.m) {
    const MaxSum t = a;
    a = b;
    b = t;
  }
  return {a.m, a.s + b.s * exp2f(b.m - a.m)};
}

__device__ __forceinline__ MaxSum block_reduce(MaxSum v) {
  __shared__ MaxSum warp_results[kThreads / 32];
  __shared__ MaxSum total;
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum o{__shfl_xor_sync(0xffffffff, v.m, offset), __shfl_xor_sync(0xffffffff, v.s, offset)};
    v = merge(v, o);
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? warp_results[lane] : MaxSum{-INFINITY, 0.f};
    for (int offset = 16; offset > 0; offset /= 2) {
      MaxSum o{__shfl_xor_sync(0xffffffff, v.m, offset), __shfl_xor_sync(0xffffffff, v.s, offset)};
      v = merge(v, o);
    }
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// kVec elements per load: 8 (16 bytes) when the row is 16-byte aligned and vocab % 8 == 0, else 1.
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads)
    softmax_xent(T* __restrict__ logits, const int64_t* __restrict__ targets,
                 float* __restrict__ loss, int64_t vocab, int64_t stride,
                 const int64_t* __restrict__ count, int64_t ignore_index) {
  const int64_t row = blockIdx.x;
  T* x = logits + row * stride;
  const int64_t target = targets[row];
  const bool ignored = target == ignore_index;
  const bool valid = !ignored && target >= 0 && target < vocab;
  const int64_t n_vec = vocab / kVec;

  struct alignas(sizeof(T) * kVec) Pack {
    T v[kVec];
  };
  Pack* xv = reinterpret_cast<Pack*>(x);

  // An ignored row adds 0 to the loss and has a zero gradient, as torch's ignore_index; any other
  // target outside the vocabulary has loss NaN (it poisons the mean) and a zero gradient. The
  // whole block takes this branch (one target per block), so no barrier is skipped by only some
  // threads, and the row is written without being read.
  if (!valid) {
    if (threadIdx.x == 0) loss[row] = ignored ? 0.f : NAN;
    Pack zero;
#pragma unroll
    for (int k = 0; k < kVec; ++k) zero.v[k] = from_float<T>(0.f);
    for (int64_t i = threadIdx.x; i < n_vec; i += kThreads) xv[i] = zero;
    return;
  }

  // Pass 1: max and sum of exponentials, in log2 units.
  MaxSum acc{-INFINITY, 0.f};
  for (int64_t i = threadIdx.x; i < n_vec; i += kThreads) {
    const Pack p = xv[i];
    float f[kVec];
    float local_max = -INFINITY;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      f[k] = to_float(p.v[k]) * kLog2e;
      local_max = fmaxf(local_max, f[k]);
    }
    if (local_max == -INFINITY) continue;
    float local_sum = 0.f;
#pragma unroll
    for (int k = 0; k < kVec; ++k) local_sum += exp2f(f[k] - local_max);
    acc = merge(acc, MaxSum{local_max, local_sum});
  }
  const MaxSum total = block_reduce(acc);
  const float log2_sum = total.m + log2f(total.s);  // log2 of Σ 2^(x·log2e)

  if (threadIdx.x == 0) loss[row] = (log2_sum - to_float(x[target]) * kLog2e) * kLn2;
  __syncthreads();  // thread 0 read x[target] before anyone overwrites it

  // Pass 2: gradient (softmax - onehot) / count, in place. The count of rows that are not
  // ignored is read from device memory, where the caller computed it, so the host never waits
  // for it; it is at least 1 here, since this row is counted.
  const float row_scale = 1.f / static_cast<float>(*count);
  for (int64_t i = threadIdx.x; i < n_vec; i += kThreads) {
    Pack p = xv[i];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int64_t j = i * kVec + k;
      float g = exp2f(to_float(p.v[k]) * kLog2e - log2_sum);
      if (j == target) g -= 1.f;
      p.v[k] = from_float<T>(g * row_scale);
    }
    xv[i] = p;
  }
}

template <typename T>
cudaError_t launch(void* logits, const int64_t* targets, float* loss, int64_t rows, int64_t vocab,
                   int64_t stride, const int64_t* count, int64_t ignore, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const bool aligned =
      reinterpret_cast<uintptr_t>(logits) % 16 == 0 && vocab % 8 == 0 && stride % 8 == 0;
  T* x = static_cast<T*>(logits);
  const auto kernel = aligned ? softmax_xent<T, 8> : softmax_xent<T, 1>;
  kernel<<<rows, kThreads, 0, stream>>>(x, targets, loss, vocab, stride, count, ignore);
  return cudaGetLastError();
}

}  // namespace

int softmax_cross_entropy_forward_backward(void* logits, const int64_t* targets, float* loss,
                                           int64_t rows, int64_t vocab, int64_t stride,
                                           const int64_t* count, int64_t ignore_index,
                                           LogitType type, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const cudaError_t e =
      type == LogitType::kBFloat16
          ? launch<__nv_bfloat16>(logits, targets, loss, rows, vocab, stride, count, ignore_index,
                                  s)
          : launch<__half>(logits, targets, loss, rows, vocab, stride, count, ignore_index, s);
  return static_cast<int>(e);
}

}  // namespace fabric::kernels
