// ResNet-50 in torchvision's layout (7x7/2 stem, 3x3/2 max-pool, Bottlenecks [3, 4, 6, 3] with the
// stride on the 3x3 conv, expansion 4) for the benchmarks; tools/bench/models.py has the same
// network in PyTorch. 23.5M parameters with 10 classes.
#ifndef TOOLS_BENCH_RESNET50_H_
#define TOOLS_BENCH_RESNET50_H_

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>

#include "fabric/nn/batch_norm.h"

namespace bench {

struct BottleneckImpl : torch::nn::Cloneable<BottleneckImpl> {
  BottleneckImpl(int64_t in, int64_t mid, int64_t stride);
  void reset() override;
  torch::Tensor forward(torch::Tensor x);
  int64_t in, mid, stride;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  fabric::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  torch::nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(Bottleneck);

struct ResNet50Impl : torch::nn::Cloneable<ResNet50Impl> {
  explicit ResNet50Impl(int64_t classes = 10);
  void reset() override;
  torch::Tensor forward(torch::Tensor x);
  int64_t classes;
  torch::nn::Conv2d stem{nullptr};
  fabric::nn::BatchNorm2d stem_bn{nullptr};
  torch::nn::Sequential layers{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet50);

}  // namespace bench

#endif  // TOOLS_BENCH_RESNET50_H_
