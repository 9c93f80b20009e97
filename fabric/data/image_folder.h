// fabric::ImageFolderDataset: JPEG and PNG files with class labels (data.format: image_folder),
// decoded when a batch needs them, into uint8 [N, 3, S, S] batches.
//
// Where the files come from:
//   from_folder(ROOT)   ROOT/<class>/<file> as torchvision's ImageFolder: classes are the
//                       subfolders in sorted order (label = position), files sorted within each;
//                       hidden entries (".*") are ignored.
//   from_list(FILE)     lines "path,label" (a header line "path,label" is allowed; paths relative
//                       to FILE's folder; labels are integers >= 0).
//   from_webdataset(SHARDS)  WebDataset tar shards (fabric/data/webdataset.h): each sample's
//                       image member (jpg, jpeg or png) and its label member (cls: an integer
//                       >= 0 as text), read from the shard where they lie; errors name
//                       "SHARD:MEMBER". A sample without an image or a label is an error.
// In a class folder, a file whose name is not an image's (a labels.txt, a README.md) is left out,
// as torchvision's ImageFolder leaves it out, and listed by not_images() (the examples print one
// line counting them). An empty class folder, an image format torchvision lists but this build
// does not decode (.bmp, .ppm, .pgm, .tif, .tiff, .webp), an unreadable or corrupt image: one-line
// fabric::Error naming the file. With skip_bad_files, a file that cannot be decoded is left out of
// its batch (the batch is one example shorter) with one warning line per file on stderr, counted
// by bad_files(). A list's path that is not a .jpg/.jpeg/.png is an error at listing time.
//
// Each image (its randomness drawn from the loader's per-batch generator, in order, so a resumed
// run decodes exactly what the uninterrupted run did):
//   train   torchvision's RandomResizedCrop(S, scale=(scale_min, 1), ratio=(3/4, 4/3)) and a
//           horizontal flip with probability 1/2
//   eval    the central crop a resize of the shorter side to S / eval_crop_ratio and a centre
//           crop of S would keep (torchvision's Resize(256) + CenterCrop(224) for S = 224)
// The crop is resized to S x S with antialiased bilinear interpolation (torchvision's
// antialias=True) on uint8 pixels; a JPEG is decoded at the smallest DCT scale that still holds the
// crop at S pixels (up to 8x less decoding work for large photos). Memory per batch in flight:
// one decoded image at a time per loader thread plus the batch itself.
//
// Example:
//   fabric::ImageFolderOptions options;
//   options.image_size = 224;
//   auto train = fabric::ImageFolderDataset::from_folder("data/imagenet/train", options);
//   auto loader = f.setup_dataloader(train, fabric::DataLoaderOptions().batch_size(256)
//                                              .num_workers(8).shuffle(true));
#ifndef FABRIC_DATA_IMAGE_FOLDER_H_
#define FABRIC_DATA_IMAGE_FOLDER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "fabric/data/dataset.h"
#include "fabric/data/image_decode.h"

namespace fabric {

struct ImageFolderOptions {
  int64_t image_size = 224;  // S: output height and width
  bool train = true;         // random resized crop + flip; false: resize + centre crop
  double scale_min = 0.08;   // train: smallest crop area, as a fraction of the image
  double eval_crop_ratio = 0.875;
  bool skip_bad_files = false;
  int64_t max_image_pixels = kDefaultMaxImagePixels;
  // Decode JPEGs at 1/2, 1/4 or 1/8 scale when the crop still gets S pixels (false: always the
  // full size, as torchvision's loader does; for like-for-like benchmarks).
  bool dct_scaling = true;
};

class ImageFolderDataset : public Dataset {
 public:
  // Throws fabric::Error naming the folder or file (see above).
  static std::shared_ptr<ImageFolderDataset> from_folder(const std::string& root,
                                                         const ImageFolderOptions& options);
  static std::shared_ptr<ImageFolderDataset> from_list(const std::string& list_file,
                                                       const ImageFolderOptions& options);
  static std::shared_ptr<ImageFolderDataset> from_webdataset(const std::vector<std::string>& shards,
                                                             const ImageFolderOptions& options);
  // REQUIRES: files.size() == labels.size().
  ImageFolderDataset(std::vector<std::string> files, std::vector<int64_t> labels,
                     std::vector<std::string> classes, ImageFolderOptions options);
  ~ImageFolderDataset() override;

  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  // Without a generator (no randomness): the eval pipeline, whatever options.train says.
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  Batch get_batch(const std::vector<int64_t>& indices, at::Generator& gen) const override;

  // Streamed reading (DataLoaderOptions::shuffle_buffer > 0): for shards, one shard per shard
  // file and {shard, byte offset of the image member} for locate(); otherwise one shard holding
  // every file, in order, and {0, index}. will_read (the loader's read-ahead, in any order) asks
  // the kernel to read the bytes ahead (posix_fadvise WILLNEED; a run of one shard's examples as
  // one range), so the decoding threads find them in the page cache; an image file stays open
  // (up to 1024 at a time) until the thread that decodes it reads it, so the hint costs no open.
  std::vector<int64_t> shard_sizes() const override;
  std::pair<int64_t, int64_t> locate(int64_t index) const override;
  void will_read(const std::vector<int64_t>& indices) const override;

  // Class names by label (folder names; "0", "1", ... for a list or shards).
  const std::vector<std::string>& classes() const { return classes_; }
  // The images' names as errors give them (paths; "SHARD:MEMBER" for shards).
  const std::vector<std::string>& files() const { return files_; }
  const std::vector<int64_t>& labels() const { return labels_; }
  // Files left out so far (skip_bad_files), each counted once.
  int64_t bad_files() const;
  // from_folder: the files of class folders left out because their names are not images', sorted.
  const std::vector<std::string>& not_images() const { return not_images_; }
  const ImageFolderOptions& options() const { return options_; }

 private:
  Batch build(const std::vector<int64_t>& indices, at::Generator* gen) const;
  std::string bytes_of(size_t index) const;
  std::vector<std::string> files_;
  std::vector<std::string> not_images_;
  // Shards: image i is ranges_[i] = {offset, size} of shards_[shard_of_[i]] (empty otherwise).
  std::vector<std::string> shards_;
  std::vector<uint32_t> shard_of_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  std::vector<int64_t> labels_;
  std::vector<std::string> classes_;
  ImageFolderOptions options_;
  mutable std::mutex bad_mutex_;
  mutable std::set<int64_t> bad_;
  // Image files the loader's read-ahead opened, by index, until a decoding thread takes them.
  mutable std::mutex opened_mutex_;
  mutable std::unordered_map<int64_t, int> opened_;
};

}  // namespace fabric

#endif  // FABRIC_DATA_IMAGE_FOLDER_H_
