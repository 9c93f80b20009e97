#include "tools/bench/resnet50.h"

namespace bench {
namespace nn = torch::nn;

namespace {
nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride = 1) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, k).stride(stride).padding(k / 2).bias(false));
}
}  // namespace

BottleneckImpl::BottleneckImpl(int64_t in, int64_t mid, int64_t stride)
    : in(in), mid(mid), stride(stride) {
  reset();
}

void BottleneckImpl::reset() {
  const int64_t out = mid * 4;
  conv1 = register_module("conv1", conv(in, mid, 1));
  bn1 = register_module("bn1", fabric::nn::BatchNorm2d(mid));
  conv2 = register_module("conv2", conv(mid, mid, 3, stride));
  bn2 = register_module("bn2", fabric::nn::BatchNorm2d(mid));
  conv3 = register_module("conv3", conv(mid, out, 1));
  bn3 = register_module("bn3", fabric::nn::BatchNorm2d(out));
  shortcut = nn::Sequential();
  if (stride != 1 || in != out) {
    shortcut->push_back(conv(in, out, 1, stride));
    shortcut->push_back(fabric::nn::BatchNorm2d(out));
  }
  register_module("shortcut", shortcut);
}

torch::Tensor BottleneckImpl::forward(torch::Tensor x) {
  auto y = torch::relu(bn1(conv1(x)));
  y = torch::relu(bn2(conv2(y)));
  y = bn3(conv3(y));
  return torch::relu(y + (shortcut->is_empty() ? x : shortcut->forward(x)));
}

ResNet50Impl::ResNet50Impl(int64_t classes) : classes(classes) { reset(); }

void ResNet50Impl::reset() {
  stem = register_module("stem", conv(3, 64, 7, 2));
  stem_bn = register_module("stem_bn", fabric::nn::BatchNorm2d(64));
  layers = nn::Sequential();
  int64_t in = 64;
  const int64_t counts[] = {3, 4, 6, 3};
  for (int64_t stage = 0; stage < 4; ++stage) {
    const int64_t mid = int64_t{64} << stage;
    for (int64_t i = 0; i < counts[stage]; ++i) {
      layers->push_back(Bottleneck(in, mid, i == 0 && stage > 0 ? 2 : 1));
      in = mid * 4;
    }
  }
  register_module("layers", layers);
  fc = register_module("fc", nn::Linear(in, classes));
}

torch::Tensor ResNet50Impl::forward(torch::Tensor x) {
  x = torch::max_pool2d(torch::relu(stem_bn(stem(x))), 3, 2, 1);
  x = layers->forward(x);
  return fc(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
}

}  // namespace bench
