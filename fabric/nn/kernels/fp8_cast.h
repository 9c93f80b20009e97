// C interface of the float8 quantization kernels (fp8_cast.cu, compiled by nvcc when the build has
// one: tools/bazel/cuda.bzl). No CUDA or LibTorch types; fabric/nn/fp8_quantize.cc calls them for
// CUDA tensors, in place of six ATen kernels per operand and the transposed copies _scaled_mm
// needs.
#ifndef FABRIC_NN_KERNELS_FP8_CAST_H_
#define FABRIC_NN_KERNELS_FP8_CAST_H_

#include <cstdint>

namespace fabric::kernels {

// Every kernel reads 16 bytes at a time: x must be 16-byte aligned, and for the kernels taking
// rows × cols both must be multiples of 8 (else cudaErrorInvalidValue from those; fp8_amax
// answers a misaligned x with cudaErrorMisalignedAddress); fabric/nn/fp8_gemm.cc's GEMM operands
// are multiples of 16.

// Element types the kernels read.
enum class Fp8Source { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// What a tensorwise cast reads x as (fp8_amax, fp8_cast, fp8_cast_delayed): x itself, or an
// elementwise function of x and the tensors a and b (x's type and shape, 16-byte aligned; null
// where the function takes none), computed in float32 as the unfused CUDA kernel computes it
// (activations.cuh) and rounded to x's type wherever that kernel's outputs are: the values it
// would have written, which the cast then reads, so that they are never written in 16 bits. The
// amax, the cast, the record and the column sums are of those values. A kernel given an op whose
// operand is null returns cudaErrorInvalidValue; one not 16-byte aligned,
// cudaErrorMisalignedAddress.
enum class Fp8Op {
  kNone = 0,
  kGeluTanh = 1,        // gelu(x, "tanh"): a GPT MLP's second layer's input
  kGeluTanhGrad = 2,    // gelu_backward(x, a, "tanh"): x the GELU's output gradient, a its input
  kSwiglu = 3,          // silu(x) · a: x a Llama MLP's gate, a its up (as llama_ops.h's kernel)
  kSwigluGateGrad = 4,  // silu_backward(x · b, a): x the SwiGLU's output gradient, a the gate, b
                        // the up (the gate's gradient, as llama_ops.h's swiglu_backward)
  kSwigluUpGrad = 5,    // x · silu(a): the up's gradient
};
struct Fp8Pointwise {
  Fp8Op op = Fp8Op::kNone;
  const void* a = nullptr;
  const void* b = nullptr;
};

// *amax = the largest |x| over n contiguous elements of `type` (float32, on the device; NaN when x
// holds one). Returns 0 or the cudaError_t of the launch.
// With f, of f's values.
int fp8_amax(const void* x, int64_t n, Fp8Source type, float* amax, void* stream,
             const Fp8Pointwise& f = {});

// The largest magnitudes of SwiGLU's two gradients from one pass over their inputs (tensorwise
// scaling casts both, each after its amax): amax[0] = that of kSwigluGateGrad's values of dy with
// gate and up, amax[1] = that of kSwigluUpGrad's of dy with gate; n contiguous elements of
// `type` each, 16-byte aligned (else cudaErrorMisalignedAddress).
int fp8_amax_swiglu_grads(const void* dy, const void* gate, const void* up, int64_t n,
                          Fp8Source type, float* amax, void* stream);

// With s = largest / max(*amax, 1e-12) in float32 (largest: 448 for e4m3, 57344 for e5m2), writes
// q = x · s rounded to the nearest float8 (e4m3fn, or e5m2 when `e5m2`), saturated to ±largest,
// for x of rows × cols (row-major, contiguous): q row-major (when not null) and qt, its transpose
// (cols × rows row-major, when not null), and *inverse = 1 / s: the same values and bits as ATen's
// (x.to(float) · s).clamp(-largest, largest).to(float8) and s.reciprocal().
// When `col_sums` is not null it also receives x's column sums in float32, per row tile:
// col_sums[t · cols + c] = the sum of column c over rows kFp8SumRows · t .. kFp8SumRows · t +
// kFp8SumRows - 1 (ceil(rows / kFp8SumRows) tiles; the sum over t is x's column sum: a Linear's
// bias gradient, taken from the read the cast makes anyway). Deterministic: a fixed order.
constexpr int64_t kFp8SumRows = 64;
int fp8_cast(const void* x, int64_t rows, int64_t cols, Fp8Source type, bool e5m2,
             const float* amax, void* q, void* qt, float* inverse, void* stream,
             float* col_sums = nullptr, const Fp8Pointwise& f = {});

// Delayed scaling (fabric.fp8.recipe: delayed): as fp8_cast, with the scale taken from a history
// of earlier amaxes rather than this tensor's: s = largest / max(h, 1e-12), h the largest finite
// value of history[0 .. history_len) (non-finite entries count as 0), so no pass over x precedes
// the cast. When `record` is not null the kernel also takes x's own largest |x| (NaN when x holds
// one) into *record (an atomic maximum: *record must hold 0 or less before); col_sums as
// fp8_cast's. margin (>= 0, else cudaErrorInvalidValue): s = largest · 2^-margin / max(h, 1e-12),
// headroom for a tensor whose amax outgrows its history's (Transformer Engine's margin).
int fp8_cast_delayed(const void* x, int64_t rows, int64_t cols, Fp8Source type, bool e5m2,
                     const float* history, int history_len, float* record, void* q, void* qt,
                     float* inverse, void* stream, float* col_sums = nullptr,
                     const Fp8Pointwise& f = {}, int margin = 0);

// How fp8_cast, fp8_cast_delayed and fp8_cast_axes size their grid (process-wide): kWave (the
// default) about one resident wave of blocks, each casting several 64 x 64 tiles with its next
// tile's loads in flight; kTile a block per tile (the kernels before 2026-11-30; kept so that
// one build measures both: FABRIC_FP8_CAST_GRID=tile, read by fabric/nn/fp8_quantize.cc).
enum class Fp8CastGrid { kWave = 0, kTile = 1 };
void fp8_set_cast_grid(Fp8CastGrid grid);

// Moves history[0 .. history_len) one place older (the oldest dropped), puts history[history_len]
// (the amax fp8_cast_delayed recorded) at history[0] and zeroes history[history_len]: one thread,
// so the next cast that reads the history sees it whole.
int fp8_history_push(float* history, int history_len, void* stream);

// qt = the transpose of q (rows × cols float8 bytes of either kind, row-major, 16-byte aligned,
// rows and cols multiples of 8, else cudaErrorInvalidValue): the column-major operand backward's
// GEMM wants, for a float8 tensor written row-major by its producer (a LayerNorm under delayed
// scaling, fabric/models/kernels/layer_norm.h).
int fp8_transpose(const void* q, int64_t rows, int64_t cols, void* qt, void* stream);

// Rowwise scaling, for x of rows × cols (row-major, contiguous): row_amax[r] = the largest |x| of
// row r, col_amax[c] that of column c (float32 on the device; NaN where the line holds one).
int fp8_amax_axes(const void* x, int64_t rows, int64_t cols, Fp8Source type, float* row_amax,
                  float* col_amax, void* stream);

// As fp8_cast, with a scale per line: q's row r (row-major, when not null) with
// s_r = largest / max(row_amax[r], 1e-12), qt's row c (x's column c, when not null) with t_c from
// col_amax[c]; row_inverse[r] = 1 / s_r and col_inverse[c] = 1 / t_c (each when not null).
int fp8_cast_axes(const void* x, int64_t rows, int64_t cols, Fp8Source type, bool e5m2,
                  const float* row_amax, const float* col_amax, void* q, void* qt,
                  float* row_inverse, float* col_inverse, void* stream);

}  // namespace fabric::kernels

#endif  // FABRIC_NN_KERNELS_FP8_CAST_H_
