// Delayed scaling's amax histories (fabric.fp8.recipe: delayed; fabric/nn/fp8.h's Fp8History) in
// checkpoints. They are per rank (each rank's histories hold the amaxes of its own activations
// and gradients), so Fabric::save gathers every rank's, next to its generator states, and
// Fabric::load gives each rank its own back: a resumed run scales its first steps as the
// uninterrupted run did (bitwise the same weights), instead of seeding the histories again.
#ifndef FABRIC_NN_FP8_HISTORY_H_
#define FABRIC_NN_FP8_HISTORY_H_

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace fabric::nn {

// Modules under their names (a checkpoint's entry names): a layer's history is named
// "ENTRY/LAYER" ("ENTRY" for the module itself).
using NamedModules = std::vector<std::pair<std::string, torch::nn::Module*>>;

// The histories of `modules`' layers that have quantized (an Fp8History with its amaxes), packed
// for a gather: per layer, its amaxes [3, length + 1] then its seeded flags as 0 or 1, in one
// float32 tensor on the CPU, and one line "NAME LENGTH" per layer, in the same order.
struct Fp8HistoryPack {
  torch::Tensor values;
  std::string names;
};
Fp8HistoryPack pack_fp8_histories(const NamedModules& modules);

// A pack (any rank's) as the checkpoint keeps it: {NAME: {"amax": float32 [3, length + 1],
// "seeded": bool [3]}}. Throws fabric::Error when values and names disagree.
c10::impl::GenericDict fp8_histories_dict(const torch::Tensor& values, const std::string& names);

// What writes `saved` (this rank's fp8_histories_dict) back into `modules`' layers: the layers it
// names get its amaxes and flags (in place where the layer's history is on a device already), the
// others start afresh, as before their first pass. When it does not fit (a name no layer has, a
// length other than the layer's, a malformed value) returns an empty function and sets `why` to
// one line naming the first difference.
std::function<void()> restore_fp8_histories(const c10::IValue& saved, const NamedModules& modules,
                                            std::string* why);

}  // namespace fabric::nn

#endif  // FABRIC_NN_FP8_HISTORY_H_
