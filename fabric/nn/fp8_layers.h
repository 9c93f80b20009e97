// The float8 entry points of models built of fabric::nn::Linear layers (fp8_layers.cc): layers
// handed to fabric/nn/fp8.h's nodes of several layers when they run whole in float8 with one
// recipe (a GPT MLP, a Llama's q, k and v, a Llama MLP), and a layer's input cast made by the
// kernel that writes its input (a fused norm: Fp8Producer). The same values as the layers'
// separate forwards in every case.
#ifndef FABRIC_NN_FP8_LAYERS_H_
#define FABRIC_NN_FP8_LAYERS_H_

#include <torch/types.h>

#include <functional>
#include <vector>

#include "fabric/nn/fp8.h"
#include "fabric/nn/tensor_parallel.h"

namespace fabric::nn {

// proj.forward_gelu_tanh(fc.forward(x)) (a GPT MLP), as fabric::nn::fp8_gelu_mlp's one float8
// node when both layers run whole in float8 (whole_fp8) with one recipe, tensorwise or delayed
// (on CUDA one pass less over the hidden gradient); the same values either way.
torch::Tensor gelu_tanh_mlp(LinearImpl& fc, LinearImpl& proj, const torch::Tensor& x);

// What writes a layer's input (a model's norm): given a cast to take (Fp8InputCast, or null),
// returns the input, or, having taken a delayed cast (its `taken` set), a stand-in for it
// (fp8_stand_in: the input itself is then never written), or, having taken a tensorwise one (the
// input's amax), the input.
using Fp8Producer = std::function<torch::Tensor(Fp8InputCast* cast)>;

// layer.forward(produce(nullptr)); but when the layer runs whole in float8 with delayed scaling
// and its input history is seeded, produce is handed the layer's input cast to make (on CUDA a
// fused LayerNorm writes its output as float8: fabric/models/fused_layer_norm.h), and the layer
// reads it; with tensorwise scaling, the input's amax to take as it writes the input, which the
// layer's cast reads instead of a pass of its own: the same output, gradients and history either
// way. like: a tensor of the input's sizes (the last one the layer's in_features) and device,
// read for them only (the norm's input).
torch::Tensor produced_forward(LinearImpl& layer, const torch::Tensor& like,
                               const Fp8Producer& produce);

// gelu_tanh_mlp(fc, proj, produce(nullptr)), with fc's input cast made by `produce` as in
// produced_forward (fp8_gelu_mlp's node, or its two layers, reading it).
torch::Tensor gelu_tanh_mlp(LinearImpl& fc, LinearImpl& proj, const torch::Tensor& like,
                            const Fp8Producer& produce);

// layers[i]->forward(x) for each layer (layers reading one input: a Llama's q, k and v
// projections), as fabric::nn::fp8_linears' one node (x quantized once for all of them) when every
// layer runs whole in float8 (whole_fp8) with one recipe; the same values either way.
std::vector<torch::Tensor> shared_input_forward(const std::vector<LinearImpl*>& layers,
                                                const torch::Tensor& x);

// shared_input_forward(layers, produce(nullptr)), with the layers' one input cast made by
// `produce` as in produced_forward (fp8_linears' node reading it) when every layer runs whole in
// float8 with one recipe, tensorwise or delayed, they can take one cast, and (delayed) the
// first's input history is seeded.
std::vector<torch::Tensor> shared_input_forward(const std::vector<LinearImpl*>& layers,
                                                const torch::Tensor& like,
                                                const Fp8Producer& produce);

// down.forward(swiglu(g, u)) with g, u = gate(x), up(x) (a Llama MLP; swiglu: the caller's
// silu(g) · u), as fabric::nn::fp8_swiglu_mlp's one float8 node when all three layers run whole in
// float8 (whole_fp8) with one recipe, tensorwise or delayed (on CUDA the SwiGLU and its backward
// computed in the casts with fabric/nn/kernels/activations.cuh's formulas, those of
// fabric/models' fused SwiGLU kernel; on the CPU bitwise the separate layers); else, and where
// the node does not apply (fp8_swiglu_mlp), shared_input_forward({gate, up}), swiglu, down.
torch::Tensor swiglu_mlp(LinearImpl& gate, LinearImpl& up, LinearImpl& down, const torch::Tensor& x,
                         SwigluFn swiglu);

// swiglu_mlp(gate, up, down, produce(nullptr), swiglu), with gate's and up's one input cast made
// by `produce` as in shared_input_forward (fp8_swiglu_mlp's node, or fp8_linears', reading it).
torch::Tensor swiglu_mlp(LinearImpl& gate, LinearImpl& up, LinearImpl& down,
                         const torch::Tensor& like, const Fp8Producer& produce, SwigluFn swiglu);

}  // namespace fabric::nn

#endif  // FABRIC_NN_FP8_LAYERS_H_
