// Activation checkpointing (LibTorch has no torch.utils.checkpoint): run a piece of the model
// without keeping its intermediate activations, and recompute them during backward.
//
//   x = fabric::checkpoint_activations(block, x);          // a module with forward(Tensor)
//   auto outs = fabric::checkpoint([&](const fabric::TensorList& in) {
//     return fabric::TensorList{f(in[0], in[1])};
//   }, {a, b});                                           // any function of tensors
//
// Forward runs the function under no-grad and keeps only its inputs; backward runs it again with
// gradients on and back-propagates through the recomputed graph (reentrant, as
// torch.utils.checkpoint(use_reentrant=True)). The recomputation sees what the first run saw:
//   - the same random numbers: the CPU generator's state (and, in CUDA builds, the default
//     generator of every CUDA device the inputs are on) is set to the forward's, and restored
//     after, so dropout masks match;
//   - the same autocast state (enabled and dtype, CPU and CUDA);
//   - the same module buffers with checkpoint_activations(module, ...): the buffers (BatchNorm's
//     running statistics) are put back after the recomputation, so they are updated once per step
//     as without checkpointing.
// The gradients are therefore bitwise those of the plain module (tests/fabric/training/
// activation_checkpoint_test.cc; under ddp the cifar10 example,
// tests/integration/training_features_test.cc).
// With gradients off (evaluation) the function simply runs. Cost: one more forward of the wrapped
// piece per step; saving: its activations (docs/benchmarks.md, activation checkpointing).
//
// Limits: every output must be a floating tensor or one without gradient; the function must not
// change what it does between the two runs except through the state above; a function that runs
// collectives (SyncBatchNorm) runs them again in backward, on every rank in the same order.
#ifndef FABRIC_TRAINING_ACTIVATION_CHECKPOINT_H_
#define FABRIC_TRAINING_ACTIVATION_CHECKPOINT_H_

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <vector>

namespace fabric {

using TensorList = std::vector<torch::Tensor>;

// `module`: optional; its buffers are restored after the recomputation, and its parameters get
// gradients even when no input requires one (without it, the parameters `fn` uses get gradients
// only when some input requires one, as with torch.utils.checkpoint(use_reentrant=True)).
TensorList checkpoint(std::function<TensorList(const TensorList&)> fn, const TensorList& inputs,
                      torch::nn::Module* module = nullptr);

// `module`'s forward(input) without its activations kept (a ModuleHolder like torch::nn::Linear,
// or a custom module's holder).
template <typename Holder>
torch::Tensor checkpoint_activations(Holder& module, const torch::Tensor& input) {
  return checkpoint([&module](const TensorList& in) { return TensorList{module->forward(in[0])}; },
                    {input}, module.ptr().get())[0];
}

}  // namespace fabric

#endif  // FABRIC_TRAINING_ACTIVATION_CHECKPOINT_H_
