// Host emulation of the CUDA built-ins our kernels use, so that their index arithmetic, tiling,
// shared-memory exchanges and reductions run (slowly) on a CPU in CI: one std::thread per CUDA
// thread of a block, blocks one after another, __shared__ arrays as statics (one block at a
// time), dynamic shared memory as one buffer, __syncthreads as a barrier of the block, warp
// shuffles over a barrier of the warp (so, as on the device with a full mask, all 32 lanes of a
// warp must take part). Float8/bf16/fp16 conversions are the CUDA headers' own host versions
// (the device's rounding); float math is the host's (exp2f, rsqrtf: within a few ulp).
// Included by tools/cuda_emu/launches.py's output (tools/bazel/cuda.bzl: cuda_emulated_test); not
// part of any library.
#ifndef TOOLS_CUDA_EMU_SHIM_H_
#define TOOLS_CUDA_EMU_SHIM_H_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <driver_types.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#undef __global__
#define __global__
#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __align__
#define __align__(n) __attribute__((aligned(n)))
#define cudaMemsetAsync fabric_emu_memset
#define cudaGetLastError fabric_emu_last_error
#define cudaFuncSetAttribute fabric_emu_set_attribute
#define cudaGetDevice fabric_emu_get_device
#define cudaDeviceGetAttribute fabric_emu_device_attribute
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor fabric_emu_occupancy

namespace fabric_emu {
inline thread_local dim3 thread_index, block_index;
inline dim3 grid_size, block_size;
inline std::barrier<>* block_barrier = nullptr;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline uint64_t shuffle_slots[1024];
inline std::vector<std::max_align_t> dynamic_shared;  // extern __shared__ (launches.py)
}  // namespace fabric_emu

#define threadIdx fabric_emu::thread_index
#define blockIdx fabric_emu::block_index
#define gridDim fabric_emu::grid_size
#define blockDim fabric_emu::block_size

inline cudaError_t fabric_emu_memset(void* p, int value, size_t bytes, cudaStream_t) {
  std::memset(p, value, bytes);
  return cudaSuccess;
}
inline cudaError_t fabric_emu_last_error() { return cudaSuccess; }
template <typename F>
cudaError_t fabric_emu_set_attribute(F, cudaFuncAttribute, int) {
  return cudaSuccess;
}
// A small device: 4 multiprocessors holding one block each, so that kernels sizing their grid
// to the device (fp8_cast's cast_grid) loop over several tiles per block here.
inline cudaError_t fabric_emu_get_device(int* device) {
  *device = 0;
  return cudaSuccess;
}
inline cudaError_t fabric_emu_device_attribute(int* value, cudaDeviceAttr attribute, int) {
  *value = attribute == cudaDevAttrMultiProcessorCount ? 4 : 0;
  return cudaSuccess;
}
template <typename F>
cudaError_t fabric_emu_occupancy(int* blocks, F, int, size_t) {
  *blocks = 1;
  return cudaSuccess;
}
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
// Round-to-nearest float32 arithmetic that is never contracted into a fused multiply-add
// (volatile: the host compiler may not fuse across it either).
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float __fadd_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}

inline void __syncthreads() { fabric_emu::block_barrier->arrive_and_wait(); }

// Every lane of the caller's warp must call it (the device's rule for a full mask).
template <typename T>
T __shfl_xor_sync(unsigned /*mask*/, T value, int lane_mask) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffles of up to 8 bytes");
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  std::barrier<>& warp = *fabric_emu::warp_barriers[t / 32];
  std::memcpy(&fabric_emu::shuffle_slots[t], &value, sizeof(T));
  warp.arrive_and_wait();
  T other;
  std::memcpy(&other, &fabric_emu::shuffle_slots[(t & ~31u) | ((t % 32) ^ lane_mask)], sizeof(T));
  warp.arrive_and_wait();
  return other;
}

inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) {
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  fabric_emu::warp_barriers[t / 32]->arrive_and_wait();
}

inline int atomicMax(int* address, int value) {
  std::atomic_ref<int> a(*address);
  int old = a.load();
  while (old < value && !a.compare_exchange_weak(old, value)) {
  }
  return old;
}

inline int __float_as_int(float f) {
  int i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

using std::max;
using std::min;

// kernel<<<grid, block, shared, stream>>>(args) becomes fabric_emu::launch(grid, block, shared,
// [&] { kernel(args); }): the block's threads are started once and run the blocks in order.
namespace fabric_emu {
inline void launch(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  grid_size = grid;
  block_size = block;
  const unsigned n = block.x * block.y * block.z;
  dynamic_shared.assign((shared_bytes + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t),
                        std::max_align_t{});
  std::barrier<> barrier(static_cast<std::ptrdiff_t>(n));
  block_barrier = &barrier;
  warp_barriers.clear();
  for (unsigned w = 0; w * 32 < n; ++w)
    warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(32u, n - w * 32)));
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < n; ++t)
    threads.emplace_back([&, t] {
      thread_index = dim3(t % block.x, (t / block.x) % block.y, t / (block.x * block.y));
      for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
          for (unsigned bx = 0; bx < grid.x; ++bx) {
            block_index = dim3(bx, by, bz);
            body();
            barrier.arrive_and_wait();  // the next block reuses the __shared__ statics
          }
    });
  for (auto& thread : threads) thread.join();
}
}  // namespace fabric_emu

#endif  // TOOLS_CUDA_EMU_SHIM_H_
