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
// overwritten in place with the gradient of Σ loss / *count: (softmax(row) - onehot) / *count.
// `count` points to one int64 in device memory, the number of rows whose target is not
// `ignore_index` (the caller computes it on the device, so the host never waits for it); every
// block reads it. A row whose target is `ignore_index` (torch's -100) gets loss 0 and a zero
// gradient row, so that Σ loss / *count is torch's mean over the rows that are not ignored. Any
// other target outside [0, vocab) gives loss NaN and a zero gradient row (its row is counted).
// Launched on `stream` (a cudaStream_t); returns 0, or the cudaError_t of the launch.
int softmax_cross_entropy_forward_backward(void* logits, const int64_t* targets, float* loss,
                                           int64_t rows, int64_t vocab, int64_t stride,
                                           const int64_t* count, int64_t ignore_index,
                                           LogitType type, void* stream);

}  // namespace fabric::kernels

#endif  // FABRIC_MODELS_KERNELS_CROSS_ENTROPY_H_
