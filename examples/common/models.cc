#include "examples/common/models.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/pooling.h>
#include <torch/types.h>

#include "fabric/training/activation_checkpoint.h"

namespace nn = torch::nn;

namespace examples {
namespace {

nn::Conv2d conv3x3(int64_t in, int64_t out, int64_t stride = 1) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

}  // namespace

SmallCnnImpl::SmallCnnImpl(int64_t width, int64_t hidden, int64_t classes)
    : width(width), hidden(hidden), classes(classes) {
  reset();
}

void SmallCnnImpl::reset() {
  features = register_module(
      "features", nn::Sequential(conv3x3(1, width), fabric::nn::BatchNorm2d(width), nn::ReLU(),
                                 nn::MaxPool2d(2), conv3x3(width, 2 * width),
                                 fabric::nn::BatchNorm2d(2 * width), nn::ReLU(), nn::MaxPool2d(2)));
  head =
      register_module("head", nn::Sequential(nn::Flatten(), nn::Linear(2 * width * 7 * 7, hidden),
                                             nn::ReLU(), nn::Linear(hidden, classes)));
}

torch::Tensor SmallCnnImpl::forward(torch::Tensor x) { return head->forward(features->forward(x)); }

BasicBlockImpl::BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
    : in(in), out(out), stride(stride) {
  reset();
}

void BasicBlockImpl::reset() {
  conv1 = register_module("conv1", conv3x3(in, out, stride));
  bn1 = register_module("bn1", fabric::nn::BatchNorm2d(out));
  conv2 = register_module("conv2", conv3x3(out, out));
  bn2 = register_module("bn2", fabric::nn::BatchNorm2d(out));
  shortcut = nn::Sequential();
  if (stride != 1 || in != out) {
    shortcut->push_back(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)));
    shortcut->push_back(fabric::nn::BatchNorm2d(out));
  }
  register_module("shortcut", shortcut);
}

torch::Tensor BasicBlockImpl::forward(torch::Tensor x) {
  auto y = torch::relu(bn1(conv1(x)));
  y = bn2(conv2(y));
  return torch::relu(y + (shortcut->is_empty() ? x : shortcut->forward(x)));
}

ResNet18CifarImpl::ResNet18CifarImpl(int64_t width, int64_t classes, int64_t in_channels)
    : width(width), classes(classes), in_channels(in_channels) {
  reset();
}

void ResNet18CifarImpl::reset() {
  stem = register_module("stem", conv3x3(in_channels, width));
  stem_bn = register_module("stem_bn", fabric::nn::BatchNorm2d(width));
  layers = nn::Sequential();
  int64_t in = width;
  for (int64_t stage = 0; stage < 4; ++stage) {
    const int64_t out = width << stage;
    layers->push_back(BasicBlock(in, out, stage == 0 ? 1 : 2));
    layers->push_back(BasicBlock(out, out, 1));
    in = out;
  }
  register_module("layers", layers);
  fc = register_module("fc", nn::Linear(in, classes));
}

torch::Tensor ResNet18CifarImpl::forward(torch::Tensor x) {
  x = torch::relu(stem_bn(stem(x)));
  if (checkpoint_blocks) {
    for (size_t i = 0; i < layers->size(); ++i) {
      auto block = layers->ptr<BasicBlockImpl>(i);
      x = fabric::checkpoint(
          [block](const fabric::TensorList& in) {
            return fabric::TensorList{block->forward(in[0])};
          },
          {x}, block.get())[0];
    }
  } else {
    x = layers->forward(x);
  }
  return fc(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
}

}  // namespace examples
