// Image datasets for the examples: Fashion-MNIST (gzip IDX), CIFAR-10 (binary batches, with
// download and a deterministic synthetic stand-in). Images are kept as uint8 [N, C, H, W].
#ifndef EXAMPLES_COMMON_IMAGE_DATA_H_
#define EXAMPLES_COMMON_IMAGE_DATA_H_

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fabric/fabric.h"

namespace examples {

struct ImageSplits {
  std::shared_ptr<const fabric::TensorDataset> train, test;
  std::string kind;  // "real" or "synthetic"
};

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from `root`. Throws fabric::Error naming
// the file and what is wrong with it.
ImageSplits load_fashion_mnist(const std::filesystem::path& root);

// Reads an IDX file (optionally gzip-compressed) into a uint8 tensor with its dimensions.
torch::Tensor read_idx(const std::filesystem::path& file);

// CIFAR-10 binary batches from `root` or `root`/cifar-10-batches-bin. Throws fabric::Error when a
// file is missing or malformed.
ImageSplits load_cifar10(const std::filesystem::path& root);
// True when the six CIFAR-10 binary files are present under `root`.
bool has_cifar10(const std::filesystem::path& root);
// Downloads and unpacks the official archive into `root` with the curl and tar programs. Returns
// "" on success, else why it failed.
std::string download_cifar10(const std::filesystem::path& root);
// A deterministic, learnable CIFAR-format dataset (each class a colored low-frequency pattern plus
// noise), the same on every machine and rank.
ImageSplits synthetic_cifar10(int64_t train_size, int64_t test_size);

// Transforms: fabric::normalize_images and fabric::crop_flip_normalize (fabric/data/augment.h).

}  // namespace examples

#endif  // EXAMPLES_COMMON_IMAGE_DATA_H_
