#include "fabric/nn/fp8_layers.h"

#include <torch/autograd.h>

#include <optional>
#include <vector>

#include "fabric/nn/fp8_gemm.h"

namespace fabric::nn {

namespace {

Fp8History* history_of(LinearImpl& l) { return l.fp8_history() ? &*l.fp8_history() : nullptr; }

// The layer as fabric/nn/fp8.h's nodes take it.
Fp8Layer fp8_layer(LinearImpl& l) {
  return {l.weight, l.bias, history_of(l), l.fp8_fast_accumulation()};
}

std::vector<Fp8Layer> fp8_layers(const std::vector<LinearImpl*>& layers) {
  std::vector<Fp8Layer> out;
  for (LinearImpl* l : layers) out.push_back(fp8_layer(*l));
  return out;
}

// Whether every layer runs whole in float8 (whole_fp8) with one recipe, and that recipe is not
// rowwise unless `rowwise` (the GPT and Llama MLP nodes are tensorwise or delayed only).
bool one_fp8_recipe(const std::vector<LinearImpl*>& layers, const torch::Tensor& x, bool rowwise) {
  const Fp8Scaling scaling = layers[0]->fp8_scaling();
  if (!rowwise && scaling == Fp8Scaling::kRowwise) return false;
  for (LinearImpl* l : layers)
    if (!l->whole_fp8(x) || l->fp8_scaling() != scaling) return false;
  return true;
}

// The one input cast `layers` (reading one input of like's sizes) would make this pass, for their
// producer to make: every layer whole in float8 with one recipe, tensorwise or delayed (each with
// a history), able to take one cast (detail::can_share_input: for the producer's output too,
// which needs a gradient whenever like does), and, delayed, the first's input history seeded
// (detail::input_cast_for).
std::optional<Fp8InputCast> shared_input_cast(const std::vector<LinearImpl*>& layers,
                                              const torch::Tensor& like) {
  if (layers.size() < 2 || !one_fp8_recipe(layers, like, /*rowwise=*/false)) return std::nullopt;
  const Fp8Scaling scaling = layers[0]->fp8_scaling();
  for (LinearImpl* l : layers)
    if (scaling == Fp8Scaling::kDelayed && !l->fp8_history()) return std::nullopt;
  if (!detail::can_share_input(like, fp8_layers(layers), scaling)) return std::nullopt;
  return detail::input_cast_for(scaling, history_of(*layers[0]), like, layers[0]->weight);
}

// The made cast, once its producer took it (delayed: its history pushed when the pass trains).
Fp8Input finish(const Fp8InputCast& cast, const torch::Tensor& y, const LinearImpl& first) {
  return detail::finish_input_cast(cast, detail::records(Fp8Scaling::kDelayed, y, first.weight));
}

}  // namespace

torch::Tensor gelu_tanh_mlp(LinearImpl& fc, LinearImpl& proj, const torch::Tensor& x) {
  if (!one_fp8_recipe({&fc, &proj}, x, /*rowwise=*/false))
    return proj.forward_gelu_tanh(fc.forward(x));
  const Fp8Layer a = fp8_layer(fc), b = fp8_layer(proj);
  return fp8_gelu_mlp(x, a.weight, a.bias, b.weight, b.bias, fc.fp8_scaling(), a.history, b.history,
                      a.fast_accumulation, b.fast_accumulation);
}

torch::Tensor produced_forward(LinearImpl& layer, const torch::Tensor& like,
                               const Fp8Producer& produce) {
  std::optional<Fp8InputCast> cast;
  if (layer.whole_fp8(like))
    cast = detail::input_cast_for(layer.fp8_scaling(), history_of(layer), like, layer.weight);
  if (!cast) return layer.forward(produce(nullptr));
  const torch::Tensor y = produce(&*cast);
  if (!cast->taken) return layer.forward(y);
  const Fp8Input input = finish(*cast, y, layer);
  return fp8_linear(y, layer.weight, layer.bias, layer.fp8_scaling(), history_of(layer),
                    /*gelu_tanh_input=*/false, layer.fp8_fast_accumulation(), &input);
}

torch::Tensor gelu_tanh_mlp(LinearImpl& fc, LinearImpl& proj, const torch::Tensor& like,
                            const Fp8Producer& produce) {
  std::optional<Fp8InputCast> cast;
  if (one_fp8_recipe({&fc, &proj}, like, /*rowwise=*/false) &&
      (fc.fp8_scaling() != Fp8Scaling::kDelayed || proj.fp8_history()))
    cast = detail::input_cast_for(fc.fp8_scaling(), history_of(fc), like, fc.weight);
  if (!cast) return gelu_tanh_mlp(fc, proj, produce(nullptr));
  const torch::Tensor y = produce(&*cast);
  if (!cast->taken) return gelu_tanh_mlp(fc, proj, y);
  const Fp8Input input = finish(*cast, y, fc);
  return fp8_gelu_mlp(y, fc.weight, fc.bias, proj.weight, proj.bias, fc.fp8_scaling(),
                      history_of(fc), history_of(proj), fc.fp8_fast_accumulation(),
                      proj.fp8_fast_accumulation(), &input);
}

std::vector<torch::Tensor> shared_input_forward(const std::vector<LinearImpl*>& layers,
                                                const torch::Tensor& x) {
  if (layers.size() < 2 || !one_fp8_recipe(layers, x, /*rowwise=*/true)) {
    std::vector<torch::Tensor> ys;
    for (LinearImpl* l : layers) ys.push_back(l->forward(x));
    return ys;
  }
  return fp8_linears(x, fp8_layers(layers), layers[0]->fp8_scaling());
}

std::vector<torch::Tensor> shared_input_forward(const std::vector<LinearImpl*>& layers,
                                                const torch::Tensor& like,
                                                const Fp8Producer& produce) {
  if (layers.size() == 1) return {produced_forward(*layers[0], like, produce)};
  std::optional<Fp8InputCast> cast = shared_input_cast(layers, like);
  if (!cast) return shared_input_forward(layers, produce(nullptr));
  const torch::Tensor y = produce(&*cast);
  if (!cast->taken) return shared_input_forward(layers, y);
  const Fp8Input input = finish(*cast, y, *layers[0]);
  return fp8_linears(y, fp8_layers(layers), layers[0]->fp8_scaling(), &input);
}

torch::Tensor swiglu_mlp(LinearImpl& gate, LinearImpl& up, LinearImpl& down, const torch::Tensor& x,
                         SwigluFn swiglu) {
  if (!one_fp8_recipe({&gate, &up, &down}, x, /*rowwise=*/false)) {
    const std::vector<torch::Tensor> gu = shared_input_forward({&gate, &up}, x);
    return down.forward(swiglu(gu[0], gu[1]));
  }
  return fp8_swiglu_mlp(x, fp8_layer(gate), fp8_layer(up), fp8_layer(down), gate.fp8_scaling(),
                        swiglu);
}

torch::Tensor swiglu_mlp(LinearImpl& gate, LinearImpl& up, LinearImpl& down,
                         const torch::Tensor& like, const Fp8Producer& produce, SwigluFn swiglu) {
  if (!one_fp8_recipe({&gate, &up, &down}, like, /*rowwise=*/false)) {
    // (gate and up may still share a made cast: down alone is not whole float8.)
    const std::vector<torch::Tensor> gu = shared_input_forward({&gate, &up}, like, produce);
    return down.forward(swiglu(gu[0], gu[1]));
  }
  std::optional<Fp8InputCast> cast = shared_input_cast({&gate, &up}, like);
  if (!cast) return swiglu_mlp(gate, up, down, produce(nullptr), swiglu);
  const torch::Tensor y = produce(&*cast);
  if (!cast->taken) return swiglu_mlp(gate, up, down, y, swiglu);
  const Fp8Input input = finish(*cast, y, gate);
  return fp8_swiglu_mlp(y, fp8_layer(gate), fp8_layer(up), fp8_layer(down), gate.fp8_scaling(),
                        swiglu, &input);
}

}  // namespace fabric::nn
