// fabric::nn float8 training (fabric.precision: fp8-mixed): a Linear layer's three GEMMs in
// float8 through at::_scaled_mm, with dynamic tensorwise scaling.
//
// fp8_linear(x, w, b), forward: x and w are scaled so that their largest magnitude becomes
// float8_e4m3fn's largest (448), cast to e4m3, multiplied by _scaled_mm with the inverse scales
// and a 16-bit (autocast's dtype) or x's-dtype result; the bias is added after. Backward: the
// output gradient is scaled to float8_e5m2 (largest 57344; more range, less precision) and the two
// gradient GEMMs run in float8 too: grad_x = g · w (e5m2 x e4m3), grad_w = gᵀ · x (e5m2 x e4m3,
// float32 result for the float32 master weight). The scales are computed from this step's
// tensors (dynamic), or, with delayed scaling, from the amaxes of earlier steps (Fp8History). A
// GEMM whose sizes _scaled_mm cannot take (a dimension not a multiple of 16) runs as ATen's linear
// instead, in the same call.
//
// Where it runs: CUDA devices of compute capability 8.9 or newer (Ada, Hopper, Blackwell), and the
// CPU (LibTorch 2.11 has a tensorwise _scaled_mm there: for checking numerics, not for speed).
//
// convert_to_fp8() turns it on for the fabric::nn::Linear layers of a module (the strategy's
// setup does, under fp8-mixed: Strategy::convert_module).
#ifndef FABRIC_NN_FP8_H_
#define FABRIC_NN_FP8_H_

#include <torch/nn/module.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace fabric::nn {

// How the scales are taken (fabric.fp8.recipe): one per tensor, or one per row of each GEMM
// operand (rowwise: x and the output gradient per token, the weight per output and per input
// feature; gradients in e4m3 too; CUDA only, compute capability >= 9.0; the GEMMs write bf16), or
// one per tensor from a history of earlier amaxes (delayed, below).
enum class Fp8Scaling { kTensorwise, kRowwise, kDelayed };

// Delayed scaling's state of one layer (Transformer Engine's DelayedScaling recipe, algorithm
// "max"): for each of its three GEMM operands (0 the input, 1 the weight, 2 the output gradient)
// the largest magnitudes of its last `length` quantizations. A quantization scales by the largest
// of them (the tensor's own amax is taken by the cast kernel while it casts, so no pass over the
// tensor precedes the cast: the dynamic recipe's amax pass is gone), then pushes its own amax in,
// dropping the oldest. A value beyond the history's largest saturates to ±448 (e4m3) or ±57344
// (e5m2) that step. The history advances only in passes that train: a forward that records a graph
// (gradients on, an input or the weight requiring one) and its backward; a forward without a
// graph (evaluation, activation checkpointing's first run) reads it, so the recomputation in
// backward casts with the same scales as the first run. An operand's first training pass seeds
// the history with its own amax (the same scale and bits as tensorwise); until then, a pass
// without a graph scales dynamically. Non-finite amaxes count as 0. The history is not part of the
// module's state (not in state_dict): Fabric's checkpoints keep it per rank (fp8_history.h).
// grad_margin (fabric.fp8.grad_margin, 0 to 15, else fabric::Error): the output gradient's scale
// leaves 2^grad_margin of headroom above its history's largest amax (Transformer Engine's margin,
// for the gradient only), since a gradient's amax can jump several times above its last steps'
// (up to 6x around the end of the learning-rate warm-up in a tiny GPT on the CPU), and the
// elements beyond the range saturate: e5m2 has the range to spare, e4m3 (inputs, weights) not.
struct Fp8History {
  static constexpr int64_t kDefaultGradMargin = 3;
  explicit Fp8History(int64_t length = 16, int64_t grad_margin = kDefaultGradMargin);
  int64_t length;
  int64_t grad_margin;
  // [3, length + 1] float32 on the device of the layer's last float8 GEMM (undefined before it):
  // row i's columns [0, length) hold operand i's amaxes, newest first; column `length` collects
  // the amax being taken.
  torch::Tensor amax;
  torch::Tensor seeded;  // [3] bool on the CPU: operand i has had its first training pass
};

// A Linear's input cast made by the kernel that writes the input (fabric.fp8.recipe: delayed, once
// the layer's input history is seeded): a fused LayerNorm writes its output as float8 itself
// (fabric/models/fused_layer_norm.h), so the output is never written in 16 bits and read again by
// the layer's cast. fabric::nn fills `history` and `record` and makes q and inverse
// (fp8_layers.h: produced_forward); the producer writes q [M, K] (float8_e4m3fn, row-major) =
// its output · s saturated, s = 448 / the largest finite entry of history[0 .. length), inverse = 1
// / s, and when `record` takes its output's largest magnitude into history[length] (an atomic
// maximum): the bytes, inverse and record the layer's own delayed cast of that output would make.
// Under tensorwise scaling (fabric.fp8.recipe: tensorwise) only `amax` is given ([] float32,
// zero): the producer writes its output as usual and takes its largest magnitude into amax (an
// atomic maximum), which the layer's cast then reads instead of making a pass over the output
// for it. `taken`: the producer did so (else it returned its output as usual, and the layer casts
// it).
struct Fp8InputCast {
  torch::Tensor history;  // the layer's input row of its Fp8History: [length + 1] float32
  bool record = false;
  torch::Tensor q, inverse;
  torch::Tensor amax;  // tensorwise
  bool taken = false;
};

// The input in float8 a layer reads instead of casting its input (Fp8InputCast's, with qt, q's
// transposed copy for backward); tensorwise: the input's largest magnitude only (q, qt, inverse
// undefined), the input itself given as usual.
struct Fp8Input {
  torch::Tensor q, qt, inverse;
  torch::Tensor amax;  // tensorwise
};

// The producer's path without a kernel that writes float8 (the CPU, or a norm the fused kernels
// do not take): y's cast into `cast` (ATen's ops or the cast kernels: the layer's own cast's
// bytes, inverse and record), `taken` set, and fp8_stand_in(y)'s stand-in for y returned; a
// tensorwise cast: y's largest magnitude into amax, `taken` set, y itself returned.
torch::Tensor fp8_input_from(const torch::Tensor& y, Fp8InputCast& cast);

// A stand-in for an input written only as float8: y's sizes, dtype and device with one element
// of memory (zeros, zero strides), whose gradient autograd passes to y's. Only the layer that
// takes the Fp8Input may receive it (its values are not y's).
torch::Tensor fp8_stand_in(const torch::Tensor& y);

// x [..., K], weight [N, K] (float32 master or 16-bit), bias [N] or undefined → [..., N].
// Rowwise on a CPU tensor throws fabric::Error (LibTorch's CPU _scaled_mm is tensorwise only);
// kDelayed needs `history` (fabric::Error without), which it reads and advances.
// gelu_tanh_input: computes linear(gelu(x, "tanh")) (a GPT MLP's second layer) with x the
// pre-activation: on CUDA, tensorwise, the cast kernels apply the GELU as they read x (the same
// values an unfused torch::gelu would write), so its output is never written in 16 bits; backward
// goes through the GELU from the saved pre-activation. Elsewhere torch::gelu runs first.
// fast_accumulation: the GEMMs torchao runs with _scaled_mm's use_fast_accum (Hopper's float8
// tensor cores accumulate without promoting partial sums to float32 every few steps: faster,
// less precise): the forward's under tensorwise and delayed scaling, all three under rowwise
// (whose CUTLASS kernels are fast only so); false: none. CPU GEMMs ignore it.
// input (delayed or tensorwise, with gelu_tanh_input false): x's cast made already
// (Fp8InputCast): under delayed scaling x is then a stand-in (fp8_stand_in) whose sizes, dtype
// and gradient alone are used; under tensorwise x is real and its amax taken already.
torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& bias, Fp8Scaling scaling = Fp8Scaling::kTensorwise,
                         Fp8History* history = nullptr, bool gelu_tanh_input = false,
                         bool fast_accumulation = true, const Fp8Input* input = nullptr);

// linear(gelu_tanh(linear(x, w1, b1)), w2, b2) (a GPT MLP) with both layers in float8, each with
// its own history (delayed) and fast_accumulation: the same values and gradients as
// fp8_linear(fp8_linear(x, w1, b1, …), w2, b2, …, gelu_tanh_input = true) — the GELU in the second
// layer's cast — and on CUDA one pass less in backward: the first layer's output gradient is
// quantized from the second layer's input gradient and the saved pre-activation, the GELU's
// backward computed as the cast reads them (it is never written in 16 bits: at gpt2-medium's
// size, 16384 tokens × 4096, 128 MiB a layer read and written less). Tensorwise and delayed;
// rowwise, and sizes _scaled_mm cannot take, run as the two fp8_linear calls. input: x's cast
// made already, as fp8_linear's.
torch::Tensor fp8_gelu_mlp(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                           const torch::Tensor& w2, const torch::Tensor& b2,
                           Fp8Scaling scaling = Fp8Scaling::kTensorwise,
                           Fp8History* history1 = nullptr, Fp8History* history2 = nullptr,
                           bool fast1 = true, bool fast2 = true, const Fp8Input* input = nullptr);

// One layer of fp8_linears: weight [N, K], bias [N] or undefined, its Fp8History (delayed) and
// fast_accumulation (fp8_linear's).
struct Fp8Layer {
  torch::Tensor weight, bias;
  Fp8History* history = nullptr;
  bool fast_accumulation = true;
};

// fp8_linear(x, l.weight, l.bias, scaling, l.history, false, l.fast_accumulation) for each layer l
// of layers that read one input (a Llama's q, k and v projections; gate and up where
// fp8_swiglu_mlp does not apply),
// as one autograd node that quantizes x once for all of them: one cast (on CUDA one launch, one
// pass over x) and one transposed copy kept for backward instead of one per layer. The same
// outputs and gradients (x's: the layers' summed as autograd sums separate layers', the last
// layer's first, so a model's gradients are bitwise those of separate calls). Under delayed
// scaling x's scale comes from the first layer's history, and every layer's history then holds
// the row the first's does (what each layer's own cast would have left, having seen the same
// inputs). Runs as the separate calls for one layer, or when the layers differ in
// fast_accumulation, in whether this pass records, or in whether their input history is seeded,
// or when a size does not fit _scaled_mm.
// input: x's cast made already (delayed: with the first layer's history), as fp8_linear's; the
// layers must then take one cast (fabric::Error otherwise: no separate calls).
std::vector<torch::Tensor> fp8_linears(const torch::Tensor& x, const std::vector<Fp8Layer>& layers,
                                       Fp8Scaling scaling = Fp8Scaling::kTensorwise,
                                       const Fp8Input* input = nullptr);

// down(silu(gate(x)) · up(x)) (a Llama MLP) with its three layers in float8 (each Fp8Layer with its
// own history and fast_accumulation), as one autograd node: x quantized once for gate and up (as
// fp8_linears), down's input cast computing the SwiGLU as it reads gate's and up's outputs, and
// in backward gate's and up's output-gradient casts computing the SwiGLU's backward as they read
// down's input gradient and the saved gate and up outputs (on CUDA: silu(g) · u and its two
// gradients are never written in 16 bits; under delayed scaling at a Llama 3.2 1B's size, 16384
// tokens × 8192, four passes over a 256 MiB tensor fewer a layer). The same values and gradients as
// fp8_linears(x, {gate, up}) → silu(g) · u → fp8_linear(…, down), bitwise on the CPU; on CUDA
// the casts compute the SwiGLU as fabric/models' fused SwiGLU kernel does
// (fabric/nn/kernels/activations.cuh). Tensorwise and delayed; rowwise, sizes _scaled_mm cannot
// take, and gate and up that fp8_linears would run separately run as those separate calls, with
// `swiglu` between them (a model's own silu(g) · u, say a fused kernel; null: at::silu(g) · u).
// input: x's cast made already, as fp8_linears' (gate and up must take one cast).
using SwigluFn = torch::Tensor (*)(const torch::Tensor& gate, const torch::Tensor& up);
torch::Tensor fp8_swiglu_mlp(const torch::Tensor& x, const Fp8Layer& gate, const Fp8Layer& up,
                             const Fp8Layer& down, Fp8Scaling scaling = Fp8Scaling::kTensorwise,
                             SwigluFn swiglu = nullptr, const Fp8Input* input = nullptr);

// Weight casts kept between passes: a float8 layer's weight is cast to e4m3 (with the transposed
// copy backward reads) once per change of the weight, not once per forward, so gradient
// accumulation's micro-batches, activation checkpointing's recomputation and evaluation batches
// reuse one cast (fp8_weight_cache.cc: kept from the weight's second pass, or from its first when
// its last version had two or more; 2 bytes a weight element while kept). A weight has changed
// when its memory, its version counter (any in-place op bumps it) or its layout has, and at
// release_fp8_weights(), which Fabric::step, Fabric::load, Fabric::setup_module and each CUDA
// graph replay call (and code that writes weights otherwise, through their data pointers, must
// call). The same values as a cast every pass,
// except under delayed scaling: the weight's history row advances once per change of the weight
// (in its first training pass), and the other passes over it reuse that pass's cast. Never kept:
// under inference mode, while a CUDA graph is captured, and for weights marked
// set_fp8_weight_cached(w, false) (fsdp's, gathered for each use).
void release_fp8_weights();
// The cache for the whole process (on by default; tools/bench/throughput --fp8_weight_cache=false).
void set_fp8_weight_cache(bool on);
void set_fp8_weight_cached(const torch::Tensor& weight, bool cached);
// Weight casts made so far by this process (the cache's misses; for tests and benchmarks).
int64_t fp8_weight_casts();

// Whether `device` can run float8 GEMMs with `scaling`; `why_not` (when given) receives the
// reason otherwise ("compute capability 8.0 < 8.9").
bool fp8_supported(const torch::Device& device, std::string* why_not = nullptr,
                   Fp8Scaling scaling = Fp8Scaling::kTensorwise);

struct Fp8Conversion {
  std::vector<std::string> converted;  // fabric::nn::Linear layers now in float8
  std::vector<std::string> excluded;   // matched a pattern of `exclude`
  std::vector<std::string> unmatched;  // patterns of `exclude` no fabric::nn::Linear matched
  std::vector<std::string> unfit;      // in or out features not a multiple of 16
  std::vector<std::string> plain;      // torch::nn::Linear layers (cannot be converted)
};

// Turns float8 GEMMs on for every fabric::nn::Linear of `module` except those whose name matches
// a pattern of `exclude` (the plan pattern syntax of tensor_parallel.h: '*' is one name
// component) and those whose sizes _scaled_mm cannot take, with `scaling` (kDelayed: each layer
// with its own Fp8History of `history_length` ≥ 1 steps and `grad_margin`; ignored otherwise)
// and `fast_accumulation` (fp8_linear's). Returns what it did. Also reads FABRIC_FP8_CAST_GRID
// (the CUDA cast kernels' grid, docs/building.md; fabric::Error for a value other than wave or
// tile).
Fp8Conversion convert_to_fp8(torch::nn::Module& module, const std::vector<std::string>& exclude,
                             Fp8Scaling scaling = Fp8Scaling::kTensorwise,
                             int64_t history_length = 16, bool fast_accumulation = true,
                             int64_t grad_margin = Fp8History::kDefaultGradMargin);

}  // namespace fabric::nn

#endif  // FABRIC_NN_FP8_H_
