// Models for the examples.
#ifndef EXAMPLES_COMMON_MODELS_H_
#define EXAMPLES_COMMON_MODELS_H_

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "fabric/nn/batch_norm.h"

namespace examples {

// Two conv blocks (conv 3x3 → BatchNorm → ReLU → max-pool) and a two-layer head, for 1×28×28
// inputs (Fashion-MNIST). `width` channels in the first block, 2·width in the second.
// The models are Cloneable (reset() builds the layers), as fabric.strategy: dp replicates them.
struct SmallCnnImpl : torch::nn::Cloneable<SmallCnnImpl> {
  SmallCnnImpl(int64_t width, int64_t hidden, int64_t classes = 10);
  void reset() override;
  torch::Tensor forward(torch::Tensor x);
  int64_t width, hidden, classes;
  torch::nn::Sequential features{nullptr}, head{nullptr};
};
TORCH_MODULE(SmallCnn);

// ResNet-18 for 32×32 inputs (the CIFAR variant: 3×3 stem, no max-pool), BasicBlocks [2, 2, 2, 2]
// with widths w, 2w, 4w, 8w (w = 64 is the standard model).
struct BasicBlockImpl : torch::nn::Cloneable<BasicBlockImpl> {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride);
  void reset() override;
  torch::Tensor forward(torch::Tensor x);
  int64_t in, out, stride;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  fabric::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

struct ResNet18CifarImpl : torch::nn::Cloneable<ResNet18CifarImpl> {
  explicit ResNet18CifarImpl(int64_t width = 64, int64_t classes = 10, int64_t in_channels = 3);
  void reset() override;
  torch::Tensor forward(torch::Tensor x);
  int64_t width, classes, in_channels;
  // Runs every BasicBlock through fabric::checkpoint_activations (model.activation_checkpointing:
  // [BasicBlock]): its activations are recomputed in backward instead of kept.
  bool checkpoint_blocks = false;
  torch::nn::Conv2d stem{nullptr};
  fabric::nn::BatchNorm2d stem_bn{nullptr};
  torch::nn::Sequential layers{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet18Cifar);

}  // namespace examples

#endif  // EXAMPLES_COMMON_MODELS_H_
