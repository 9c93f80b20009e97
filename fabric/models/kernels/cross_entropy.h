// C interface of the fused softmax cross-entropy kernel (cross_entropy.cu, compiled by nvcc when
// the build has one: tools/bazel/cuda.bzl). No CUDA or LibTorch types, so that host code compiled
// by the C++ compiler can call it; fabric/models/fused_cross_entropy.cc is the only caller.
#ifndef FABRIC_MODELS_KERNELS_CROSS_ENTROPY_H_
#define FABRIC_MODELS_KERNELS_CROSS_ENTROPY_H_

#include <cstdint>

namespace fabric::kernels {

// Element types of the logits.
enum class LogitType : int { kBFloat16 = 0, kFloat16 = 1 };

// For each of the `rows` rows of `logits` ([rows, vocab], row stride `stride` elements, 16-bit
// floats of `type`): loss[r] = logsumexp(row) - row[targets[r]] in float32 math, and the row is
// overwritten in place with the gradient of scale · Σ loss: scale · (softmax(row) - onehot).
// A target outside [0, vocab) gives loss NaN and a zero gradient row. Launched on `stream` (a
// cudaStream_t); returns 0, or the cudaError_t of the launch.
int softmax_cross_entropy_forward_backward(void* logits, const int64_t* targets, float* loss,
                                           int64_t rows, int64_t vocab, int64_t stride, float scale,
                                           LogitType type, void* stream);

}  // namespace fabric::kernels

#endif  // FABRIC_MODELS_KERNELS_CROSS_ENTROPY_H_
