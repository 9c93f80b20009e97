// Data loading throughput: images (or rows) per second that fabric::DataLoader delivers as
// batches, decoded, augmented and collated, on the CPU, with nothing else running. The Python
// counterpart is tools/bench/loader_throughput.py (torchvision's ImageFolder + DataLoader, or a
// TensorDataset over np.load(mmap_mode='r')); docs/benchmarks.md, "Data loading", has the commands.
//   --format=image_folder --root=DIR   DIR/<class>/*.jpg: RandomResizedCrop(--image_size) + flip,
//                                      uint8 [B, 3, S, S] (the training pipeline)
//   --format=npy --root=DIR            DIR/inputs.npy + DIR/targets.npy rows
//   --format=webdataset --shards=PATTERN  tar shards (KEY.jpg + KEY.cls), the image_folder
//                                      pipeline; also prints the time to index the shards
//   --shuffle_buffer=N                 N > 0: streamed (DataLoaderOptions::shuffle_buffer): each
//                                      shard read front to back through a shuffle buffer of N,
//                                      with read-ahead; 0: a global shuffle, images read by index
//   --noread_ahead                     streamed without the read-ahead hints (the order alone)
//   --cold                             drop the data files from the page cache before the pass
//                                      (posix_fadvise DONTNEED on every file, after indexing), so
//                                      the pass reads from the disk as a dataset larger than
//                                      memory would
// Prints one line: "images_per_second=X batches=N workers=W seconds=T" (webdataset: then
// " index_seconds=I").
#include <fcntl.h>
#include <gflags/gflags.h>
#include <torch/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

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
DEFINE_int32(shuffle_buffer, 0, "0: global shuffle; N: streamed with a shuffle buffer of N");
DEFINE_bool(cold, false, "drop the data files from the page cache before the pass");
DEFINE_bool(read_ahead, true, "streamed: pass the loader's read-ahead hints to the dataset");

namespace {

// Asks the kernel to drop `paths`' cached pages (clean pages of files no process maps go).
void drop_from_page_cache(const std::vector<std::string>& paths) {
  for (const auto& path : paths) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// The dataset without its read-ahead (--noread_ahead): the streamed order alone.
class WithoutReadAhead : public fabric::Dataset {
 public:
  explicit WithoutReadAhead(std::shared_ptr<const fabric::Dataset> d) : d_(std::move(d)) {}
  int64_t size() const override { return d_->size(); }
  fabric::Batch get_batch(const std::vector<int64_t>& i) const override { return d_->get_batch(i); }
  fabric::Batch get_batch(const std::vector<int64_t>& i, at::Generator& gen) const override {
    return d_->get_batch(i, gen);
  }
  std::vector<int64_t> shard_sizes() const override { return d_->shard_sizes(); }

 private:
  std::shared_ptr<const fabric::Dataset> d_;
};

std::vector<std::string> files_under(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root))
    if (e.is_regular_file()) out.push_back(e.path().string());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  std::shared_ptr<const fabric::Dataset> data;
  double index_seconds = -1;
  std::vector<std::string> files;  // what --cold drops
  if (FLAGS_format == "webdataset") {
    files = fabric::expand_braces(FLAGS_shards);
    fabric::ImageFolderOptions options;
    options.image_size = FLAGS_image_size;
    options.dct_scaling = FLAGS_dct;
    const auto t0 = std::chrono::steady_clock::now();
    data =
        fabric::ImageFolderDataset::from_webdataset(fabric::expand_braces(FLAGS_shards), options);
    index_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } else if (FLAGS_format == "npy") {
    data = fabric::NpyDataset::open(FLAGS_root + "/inputs.npy", FLAGS_root + "/targets.npy");
    files = files_under(FLAGS_root);
  } else {
    files = files_under(FLAGS_root);
    fabric::ImageFolderOptions options;
    options.image_size = FLAGS_image_size;
    options.dct_scaling = FLAGS_dct;
    data = fabric::ImageFolderDataset::from_folder(FLAGS_root, options);
  }
  if (!FLAGS_read_ahead) data = std::make_shared<WithoutReadAhead>(data);
  fabric::DataLoader loader(data, fabric::DataLoaderOptions()
                                      .batch_size(FLAGS_batch_size)
                                      .shuffle(true)
                                      .num_workers(FLAGS_workers)
                                      .prefetch(2 * std::max(FLAGS_workers, 1))
                                      .shuffle_buffer(FLAGS_shuffle_buffer));
  if (FLAGS_cold) drop_from_page_cache(files);
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
