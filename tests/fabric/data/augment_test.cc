// Whole-batch augmentation (fabric/data/augment.h) against a per-image reference, its
// reproducibility from the loader's per-batch generator, and fabric.channels_last.
#include "fabric/data/augment.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/conv.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <string>

#include "fabric/config/standard_keys.h"
#include "fabric/core/error.h"
#include "fabric/fabric.h"

namespace fabric {
namespace {

torch::Tensor random_images(int64_t n, int64_t c, int64_t h, int64_t w) {
  torch::manual_seed(3);
  return torch::randint(0, 256, {n, c, h, w}, torch::kLong).to(torch::kUInt8);
}

// The obvious per-image loop: pad, slice the window, mirror.
torch::Tensor reference_crop_flip(const torch::Tensor& images, int64_t pad, const torch::Tensor& dy,
                                  const torch::Tensor& dx, const torch::Tensor& flip) {
  const int64_t h = images.size(2), w = images.size(3);
  auto padded = torch::constant_pad_nd(images, {pad, pad, pad, pad}, 0);
  auto out = torch::empty_like(images);
  for (int64_t i = 0; i < images.size(0); ++i) {
    const int64_t y = dy[i].item<int64_t>(), x = dx[i].item<int64_t>();
    auto crop = padded[i].slice(1, y, y + h).slice(2, x, x + w);
    out[i].copy_(flip[i].item<bool>() ? crop.flip({2}) : crop);
  }
  return out;
}

TEST(Augment, CropFlipMatchesPerImageReference) {
  const auto images = random_images(64, 3, 8, 10);  // not square: rows and columns differ
  for (int64_t pad : {0, 1, 4}) {
    SCOPED_TRACE("pad " + std::to_string(pad));
    auto dy = torch::randint(0, 2 * pad + 1, {64}, torch::kLong);
    auto dx = torch::randint(0, 2 * pad + 1, {64}, torch::kLong);
    auto flip = torch::rand({64}) < 0.5;
    const auto ours = crop_flip(images, pad, dy, dx, flip);
    EXPECT_TRUE(torch::equal(ours, reference_crop_flip(images, pad, dy, dx, flip)));
    if (pad > 0) {
      // Some window really moved and some image was really mirrored.
      EXPECT_FALSE(torch::equal(ours, images));
    }
  }
}

// The transform draws (rows, columns, flips) in the documented order from the batch's generator:
// the same seed gives the same batch (resume), another seed another batch.
TEST(Augment, CropFlipNormalizeIsAFunctionOfTheBatchGenerator) {
  const auto images = random_images(32, 3, 8, 8);
  const std::vector<double> mean{0.5, 0.4, 0.3}, std{0.2, 0.25, 0.3};
  auto transform = crop_flip_normalize(2, mean, std);
  auto run = [&](uint64_t seed) {
    at::Generator gen = at::detail::createCPUGenerator(seed);
    return transform(Batch{images, torch::zeros({32}, torch::kLong)}, gen).data;
  };
  const auto a = run(11);
  EXPECT_TRUE(torch::equal(a, run(11)));
  EXPECT_FALSE(torch::equal(a, run(12)));

  at::Generator gen = at::detail::createCPUGenerator(11);
  auto dy = torch::randint(0, 5, {32}, gen, torch::kLong);
  auto dx = torch::randint(0, 5, {32}, gen, torch::kLong);
  auto flip = torch::rand({32}, gen) < 0.5;
  auto expected = reference_crop_flip(images, 2, dy, dx, flip).to(torch::kFloat);
  const auto m = torch::tensor(mean, torch::kFloat).view({1, 3, 1, 1}) * 255.0;
  const auto s = torch::tensor(std, torch::kFloat).view({1, 3, 1, 1}) * 255.0;
  EXPECT_TRUE(torch::allclose(a, (expected - m) / s, 0, 1e-6));
}

TEST(Augment, NormalizeRefusesMismatchedChannels) {
  EXPECT_THROW(normalize_images({0.5, 0.5}, {0.2}), Error);
  auto norm = normalize_images({0.5}, {0.2});
  at::Generator gen = at::detail::createCPUGenerator(0);
  try {
    norm(Batch{random_images(2, 3, 4, 4), torch::zeros({2}, torch::kLong)}, gen);
    FAIL() << "expected fabric::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected images [N, 1, H, W]"), std::string::npos)
        << e.what();
  }
}

TEST(Augment, DeviceDatasetOnCpuServesTheSameBatches) {
  TensorDataset cpu(random_images(10, 1, 4, 4), torch::arange(10));
  auto moved = device_dataset(cpu, torch::kCPU);
  EXPECT_TRUE(moved->device().is_cpu());
  const Batch a = cpu.get_batch({3, 1, 7}), b = moved->get_batch({3, 1, 7});
  EXPECT_TRUE(torch::equal(a.data, b.data));
  EXPECT_TRUE(torch::equal(a.target, b.target));
}

// fabric.channels_last: conv weights and 4-D batches in channels-last layout; the training step
// computes the same values as the default layout.
TEST(Augment, ChannelsLastKeepsTheMathAndChangesTheLayout) {
  auto train_once = [](bool channels_last) {
    Config config = Config::defaults(
        training_schema(),
        {"fabric.accelerator=cpu", "fabric.devices=1",
         std::string("fabric.channels_last=") + (channels_last ? "true" : "false")});
    Fabric fabric(config);
    torch::Tensor weight, first_batch;
    fabric.launch([&](Fabric& f) {
      torch::manual_seed(5);
      torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 4, 3).padding(1));
      torch::optim::SGD opt(conv->parameters(), torch::optim::SGDOptions(0.1));
      f.setup(conv, opt);
      auto loader = f.setup_dataloader(
          TensorDataset(random_images(8, 3, 6, 6), torch::zeros({8}, torch::kLong)),
          DataLoaderOptions().batch_size(4).transform(
              normalize_images({0.5, 0.5, 0.5}, {0.2, 0.2, 0.2})));
      for (Batch& batch : loader) {
        if (!first_batch.defined()) first_batch = batch.data;
        opt.zero_grad();
        f.backward(conv->forward(batch.data).square().mean());
        f.step(opt);
      }
      weight = conv->weight.detach().clone(at::MemoryFormat::Preserve);
    });
    return std::make_pair(weight, first_batch);
  };
  const auto [nchw_weight, nchw_batch] = train_once(false);
  const auto [nhwc_weight, nhwc_batch] = train_once(true);
  EXPECT_TRUE(nhwc_weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_FALSE(nchw_weight.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(nhwc_batch.is_contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(torch::allclose(nchw_weight, nhwc_weight, 1e-5, 1e-6));
}

}  // namespace
}  // namespace fabric
