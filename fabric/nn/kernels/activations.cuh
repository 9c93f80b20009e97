// Activation functions in float32 as ATen's CUDA kernels compute them (the same operations in the
// same order), for the kernels that compute them as they read their input: fp8_cast.cu (casts of
// a GELU's or a SwiGLU's output and of their gradients) and fabric/models/kernels/llama_ops.cu
// (SwiGLU forward and backward). One definition, so that a fused cast and the unfused kernel it
// replaces compute the same values. Device code only: include it after the CUDA headers, whose
// __device__ and __forceinline__ it uses (tools/cuda_emu's shim defines them for the host).
#ifndef FABRIC_NN_KERNELS_ACTIVATIONS_CUH_
#define FABRIC_NN_KERNELS_ACTIVATIONS_CUH_

namespace fabric::kernels {

// GELU's tanh approximation (ATen's GeluCUDAKernelImpl, approximate="tanh").
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  const float cube = x * x * x;
  const float inner = kBeta * (x + kKappa * cube);
  return 0.5f * x * (1.f + tanhf(inner));
}

// The gradient through gelu_tanh at x of the output gradient dy (ATen's
// GeluBackwardCUDAKernelImpl).
__device__ __forceinline__ float gelu_tanh_grad(float dy, float x) {
  constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  constexpr float kKappa = 0.044715f;
  constexpr float kKappa3 = 3.f * kKappa;
  const float x_sq = x * x;
  const float x_cube = x_sq * x;
  const float inner = kBeta * (x + kKappa * x_cube);
  const float tanh_inner = tanhf(inner);
  const float left = 0.5f * x;
  const float right = 1.f + tanh_inner;
  const float left_derivative = 0.5f * right;
  const float tanh_derivative = 1.f - tanh_inner * tanh_inner;
  const float inner_derivative = kBeta * (1.f + kKappa3 * x_sq);
  const float right_derivative = left * tanh_derivative * inner_derivative;
  return dy * (left_derivative + right_derivative);
}

// silu(x) = x / (1 + exp(-x)) (ATen's silu_kernel).
__device__ __forceinline__ float silu(float x) { return x / (1.f + expf(-x)); }

// The gradient through silu at x of the output gradient dy: dy · s · (1 + x · (1 − s)), s the
// sigmoid (ATen's silu_backward_kernel).
__device__ __forceinline__ float silu_grad(float dy, float x) {
  const float s = 1.f / (1.f + expf(-x));
  return dy * s * (1.f + x * (1.f - s));
}

}  // namespace fabric::kernels

#endif  // FABRIC_NN_KERNELS_ACTIVATIONS_CUH_
