// Data loading throughput: images (or rows) per second that fabric::DataLoader delivers as
// batches, decoded, augmented and collated, on the CPU, with nothing else running. The Python
// counterpart is tools/bench/loader_throughput.py (torchvision's ImageFolder + DataLoader, or a
// TensorDataset over np.load(mmap_mode='r')); docs/benchmarks.md, "Data loading", has the commands.
//   --format=image_folder --root=DIR   DIR/<class>/*.jpg: RandomResizedCrop(--image_size) + flip,
//                                      uint8 [B, 3, S, S] (the training pipeline)
//   --format=npy --root=DIR            DIR/inputs.npy + DIR/targets.npy rows
//   --format=webdataset --shards=PATTERN  tar shards (KEY.jpg + KEY.cls), the image_folder
//                                      pipeline; also prints the time to index the shards
// Prints one line: "images_per_second=X batches=N workers=W seconds=T" (webdataset: then
// " index_seconds=I").
#include <gflags/gflags.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>

#include "fabric/data/data_loader.h"
#include "fabric/data/image_folder.h"
#include "fabric/data/npy.h"
#include "fabric/data/webdataset.h"

DEFINE_string(format, "image_folder", "image_folder | npy | webdataset");
DEFINE_string(shards, "", "webdataset: brace pattern of the shards");
DEFINE_string(root, "", "data folder");
DEFINE_int32(workers, 2, "loader threads (DataLoaderOptions::num_workers)");
DEFINE_int32(batch_size, 64, "examples per batch");
DEFINE_int32(image_size, 224, "image_folder: crop size");
DEFINE_bool(dct, true, "image_folder: DCT-scaled JPEG decoding (false: full size, as PIL)");
DEFINE_int32(epochs, 1, "passes over the data");

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  std::shared_ptr<const fabric::Dataset> data;
  double index_seconds = -1;
  if (FLAGS_format == "webdataset") {
    fabric::ImageFolderOptions options;
    options.image_size = FLAGS_image_size;
    options.dct_scaling = FLAGS_dct;
    const auto t0 = std::chrono::steady_clock::now();
    data = fabric::ImageFolderDataset::from_webdataset(fabric::expand_braces(FLAGS_shards), options);
    index_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else if (FLAGS_format == "npy") {
    data = fabric::NpyDataset::open(FLAGS_root + "/inputs.npy", FLAGS_root + "/targets.npy");
  } else {
    fabric::ImageFolderOptions options;
    options.image_size = FLAGS_image_size;
    options.dct_scaling = FLAGS_dct;
    data = fabric::ImageFolderDataset::from_folder(FLAGS_root, options);
  }
  fabric::DataLoader loader(data, fabric::DataLoaderOptions()
                                      .batch_size(FLAGS_batch_size)
                                      .shuffle(true)
                                      .num_workers(FLAGS_workers)
                                      .prefetch(2 * std::max(FLAGS_workers, 1)));
  const auto start = std::chrono::steady_clock::now();
  int64_t images = 0, batches = 0;
  for (int e = 0; e < FLAGS_epochs; ++e) {
    for (fabric::Batch& batch : loader) {
      images += batch.size();
      ++batches;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("images_per_second=%.1f batches=%lld workers=%d seconds=%.2f", images / seconds,
              static_cast<long long>(batches), FLAGS_workers, seconds);
  if (index_seconds >= 0) std::printf(" index_seconds=%.4f", index_seconds);
  std::printf("\n");
  return 0;
}
