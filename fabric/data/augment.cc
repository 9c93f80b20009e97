#include "fabric/data/augment.h"

#include <torch/types.h>

#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "fabric/core/error.h"

namespace fabric {
namespace {

// A small CPU tensor on `device`: pinned and copied without blocking when the device is a GPU.
torch::Tensor to_device_async(const torch::Tensor& t, const c10::Device& device) {
  if (device.is_cpu()) return t;
  return t.pin_memory().to(device, /*non_blocking=*/true);
}

}  // namespace

BatchTransform normalize_images(std::vector<double> mean, std::vector<double> std) {
  if (mean.size() != std.size() || mean.empty())
    throw Error("normalize_images: mean and std need one value per channel (got " +
                std::to_string(mean.size()) + " and " + std::to_string(std.size()) + ")");
  const auto channels = static_cast<int64_t>(mean.size());
  // The constants, copied once to each device batches arrive on (loader threads may call the
  // transform concurrently, hence the lock).
  struct Constants {
    std::mutex mutex;
    std::unordered_map<c10::Device, std::pair<torch::Tensor, torch::Tensor>> by_device;
  };
  auto constants = std::make_shared<Constants>();
  constants->by_device[c10::Device(c10::kCPU)] = {
      torch::tensor(mean, torch::kFloat).mul(255.0).view({1, -1, 1, 1}),
      torch::tensor(std, torch::kFloat).mul(255.0).view({1, -1, 1, 1})};
  return [channels, constants](Batch b, at::Generator&) {
    if (b.data.dim() != 4 || b.data.size(1) != channels)
      throw Error("normalize_images: expected images [N, " + std::to_string(channels) +
                  ", H, W], got " + std::to_string(b.data.dim()) + " dimensions");
    std::pair<torch::Tensor, torch::Tensor> c;
    {
      std::lock_guard<std::mutex> lock(constants->mutex);
      auto& slot = constants->by_device[b.data.device()];
      if (!slot.first.defined()) {
        const auto& cpu = constants->by_device.at(c10::Device(c10::kCPU));
        slot = {cpu.first.to(b.data.device()), cpu.second.to(b.data.device())};
      }
      c = slot;
    }
    b.data = (b.data.to(torch::kFloat) - c.first) / c.second;
    return b;
  };
}

at::Tensor crop_flip(const at::Tensor& images, int64_t pad, const at::Tensor& dy,
                     const at::Tensor& dx, const at::Tensor& flip) {
  const int64_t n = images.size(0), c = images.size(1), h = images.size(2), w = images.size(3);
  const int64_t wp = w + 2 * pad;
  const auto padded = torch::constant_pad_nd(images, {pad, pad, pad, pad}, 0);
  const auto long_on = torch::TensorOptions().dtype(torch::kLong).device(images.device());
  const auto ys = torch::arange(h, long_on).view({1, h, 1});
  const auto xs = torch::arange(w, long_on).view({1, 1, w});
  const auto rows = dy.view({n, 1, 1}) + ys;                                 // [n, h, 1]
  const auto cols = dx.view({n, 1, 1}) + torch::where(flip.view({n, 1, 1}),  // [n, 1, w]
                                                      (w - 1) - xs, xs);
  const auto flat = (rows * wp + cols).view({n, 1, h * w}).expand({n, c, h * w});
  return padded.flatten(2).gather(2, flat).view({n, c, h, w});
}

BatchTransform crop_flip_normalize(int64_t pad, std::vector<double> mean, std::vector<double> std) {
  if (pad < 0) throw Error("crop_flip_normalize: pad must be >= 0");
  auto norm = normalize_images(std::move(mean), std::move(std));
  return [pad, norm](Batch b, at::Generator& gen) {
    const int64_t n = b.data.size(0);
    // Draw order is part of the contract (see the header).
    const auto dy = torch::randint(0, 2 * pad + 1, {n}, gen, torch::kLong);
    const auto dx = torch::randint(0, 2 * pad + 1, {n}, gen, torch::kLong);
    const auto flip = torch::rand({n}, gen) < 0.5;
    const auto device = b.data.device();
    // One host-to-device copy for all draws.
    const auto draws = to_device_async(torch::stack({dy, dx, flip.to(torch::kLong)}), device);
    b.data = crop_flip(b.data, pad, draws[0], draws[1], draws[2].to(torch::kBool));
    return norm(std::move(b), gen);
  };
}

std::shared_ptr<const TensorDataset> device_dataset(const TensorDataset& dataset,
                                                    const c10::Device& device) {
  return std::make_shared<const TensorDataset>(dataset.data().to(device),
                                               dataset.target().to(device));
}

}  // namespace fabric
