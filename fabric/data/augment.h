// Batch augmentation as whole-batch tensor ops, on whatever device the batch lives on: with the
// dataset kept on the GPU (data.on_device: true, see device_dataset() below) a training step does
// no host work beyond kernel launches and two small copies of indices and random draws.
//
// crop_flip_normalize() draws its randomness from the loader's per-batch CPU generator in a fixed
// order (crop rows, crop columns, flips), so a batch gets the same crops and flips on CPU and GPU,
// and a resumed run the same ones as the uninterrupted run.
//
// Example (examples/cifar10.cc):
//   auto train = fabric::device_dataset(*cpu_train, f.device());
//   auto loader = f.setup_dataloader(train, fabric::DataLoaderOptions().batch_size(512)
//       .transform(fabric::crop_flip_normalize(4, {0.49, 0.48, 0.45}, {0.25, 0.24, 0.26})));
#ifndef FABRIC_DATA_AUGMENT_H_
#define FABRIC_DATA_AUGMENT_H_

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <vector>

#include "fabric/data/data_loader.h"
#include "fabric/data/dataset.h"

namespace fabric {

// uint8 images [N, C, H, W] → float32 (x - 255 mean) / (255 std), per channel.
// Throws fabric::Error when mean/std do not have C entries.
BatchTransform normalize_images(std::vector<double> mean, std::vector<double> std);

// Random crop of each image out of its zero-padded copy (`pad` pixels on every side), a random
// horizontal flip (probability 1/2), then normalize_images. One gather for crop and flip.
BatchTransform crop_flip_normalize(int64_t pad, std::vector<double> mean, std::vector<double> std);

// The crop-and-flip gather alone: out[i] = crop of padded(images[i]) at (dy[i], dx[i]), mirrored
// where flip[i]. `dy`, `dx` (int64) and `flip` (bool) have one entry per image; any device.
at::Tensor crop_flip(const at::Tensor& images, int64_t pad, const at::Tensor& dy,
                     const at::Tensor& dx, const at::Tensor& flip);

// A TensorDataset whose tensors live on `device` (copied once); its batches are gathered there.
// DataLoaders over it build batches in the training thread (num_workers is ignored: there is no
// host work to overlap).
std::shared_ptr<const TensorDataset> device_dataset(const TensorDataset& dataset,
                                                    const c10::Device& device);

}  // namespace fabric

#endif  // FABRIC_DATA_AUGMENT_H_
