#include "fabric/data/image_folder.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/functional/upsampling.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "fabric/core/error.h"
#include "fabric/data/webdataset.h"

namespace fs = std::filesystem;

namespace fabric {
namespace {

std::string lower_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext;
}

bool image_name(const fs::path& p) {
  const std::string ext = lower_extension(p);
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// An image torchvision's ImageFolder would list (its IMG_EXTENSIONS) that this build cannot decode.
bool other_image_name(const fs::path& p) {
  const std::string ext = lower_extension(p);
  for (const char* other : {".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"})
    if (ext == other) return true;
  return false;
}

bool hidden(const fs::path& p) { return p.filename().string().rfind('.', 0) == 0; }

// The whole file open at `fd` (closed here). Throws fabric::Error naming `path`.
std::string read_fd(int fd, const std::string& path) {
  struct stat st {};
  std::string bytes;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) bytes.resize(static_cast<size_t>(st.st_size));
  size_t have = 0;
  for (;;) {
    if (have == bytes.size()) bytes.resize(std::max<size_t>(2 * bytes.size(), 1 << 16));
    const ssize_t got =
        ::pread(fd, bytes.data() + have, bytes.size() - have, static_cast<off_t>(have));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      ::close(fd);
      throw Error(path + ": read error");
    }
    if (got == 0) break;
    have += static_cast<size_t>(got);
  }
  ::close(fd);
  bytes.resize(have);
  return bytes;
}

std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot read: " + std::strerror(errno));
  return read_fd(fd, path);
}

// Image files the read-ahead may hold open at once (each waits for the thread that decodes it):
// 1024, or a quarter of the process's open-file limit when that is lower.
size_t max_open_ahead() {
  static const size_t limit = [] {
    struct rlimit r {};
    if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return size_t{1024};
    return std::min<size_t>(1024, static_cast<size_t>(r.rlim_cur / 4));
  }();
  return limit;
}

// Uniform doubles in [a, b) from the batch generator (53 random bits each).
struct Draw {
  at::CPUGeneratorImpl* g;
  double uniform(double a, double b) {
    const double u = static_cast<double>(g->random64() >> 11) * 0x1.0p-53;
    return a + (b - a) * u;
  }
  int64_t integer(int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(g->random64() % static_cast<uint64_t>(hi - lo + 1));
  }
};

struct Box {
  int64_t top, left, height, width;
};

// torchvision.transforms.RandomResizedCrop.get_params, drawing from `draw`.
Box random_resized_crop(int64_t h, int64_t w, double scale_min, Draw& draw) {
  const double area = static_cast<double>(h * w);
  const double log_lo = std::log(3.0 / 4.0), log_hi = std::log(4.0 / 3.0);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * draw.uniform(scale_min, 1.0);
    const double aspect = std::exp(draw.uniform(log_lo, log_hi));
    const auto cw = static_cast<int64_t>(std::llround(std::sqrt(target * aspect)));
    const auto ch = static_cast<int64_t>(std::llround(std::sqrt(target / aspect)));
    if (cw > 0 && cw <= w && ch > 0 && ch <= h)
      return {draw.integer(0, h - ch), draw.integer(0, w - cw), ch, cw};
  }
  // Fallback: the centre crop with the ratio clamped to [3/4, 4/3].
  const double ratio = static_cast<double>(w) / static_cast<double>(h);
  int64_t cw = w, ch = h;
  if (ratio < 3.0 / 4.0) ch = std::llround(static_cast<double>(w) / (3.0 / 4.0));
  if (ratio > 4.0 / 3.0) cw = std::llround(static_cast<double>(h) * (4.0 / 3.0));
  return {(h - ch) / 2, (w - cw) / 2, ch, cw};
}

// What Resize(round(S / ratio)) on the shorter side, then CenterCrop(S), keeps of the image.
Box centre_crop(int64_t h, int64_t w, int64_t s, double ratio) {
  const double side = std::round(static_cast<double>(s) / ratio);
  const double scale = static_cast<double>(std::min(h, w)) / side;  // original px per resized px
  const int64_t ch = std::min<int64_t>(h, std::llround(static_cast<double>(s) * scale));
  const int64_t cw = std::min<int64_t>(w, std::llround(static_cast<double>(s) * scale));
  return {(h - ch) / 2, (w - cw) / 2, std::max<int64_t>(ch, 1), std::max<int64_t>(cw, 1)};
}

}  // namespace

ImageFolderDataset::ImageFolderDataset(std::vector<std::string> files, std::vector<int64_t> labels,
                                       std::vector<std::string> classes, ImageFolderOptions options)
    : files_(std::move(files)),
      labels_(std::move(labels)),
      classes_(std::move(classes)),
      options_(options) {
  if (files_.size() != labels_.size())
    throw Error("ImageFolderDataset: " + std::to_string(files_.size()) + " files but " +
                std::to_string(labels_.size()) + " labels");
  if (options_.image_size < 1) throw Error("ImageFolderDataset: image_size must be >= 1");
}

std::shared_ptr<ImageFolderDataset> ImageFolderDataset::from_folder(
    const std::string& root, const ImageFolderOptions& options) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) throw Error(root + ": not a folder of class folders");
  std::vector<fs::path> class_dirs;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (hidden(e.path())) continue;
    if (e.is_directory()) class_dirs.push_back(e.path());
  }
  if (ec) throw Error(root + ": cannot list: " + ec.message());
  std::sort(class_dirs.begin(), class_dirs.end());
  if (class_dirs.empty())
    throw Error(root + ": no class folders (expected " + root + "/<class>/<image files>)");
  std::vector<std::string> files, classes;
  std::vector<int64_t> labels;
  std::vector<std::string> left_out;
  for (size_t c = 0; c < class_dirs.size(); ++c) {
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(class_dirs[c], ec)) {
      if (hidden(e.path()) || e.is_directory()) continue;
      if (other_image_name(e.path()))
        throw Error(e.path().string() +
                    ": an image format this build does not decode (it reads .jpg, .jpeg and "
                    ".png); convert it, or move it out of " +
                    root);
      if (!image_name(e.path())) {
        left_out.push_back(e.path().string());  // as torchvision leaves a labels.txt out
        continue;
      }
      entries.push_back(e.path());
    }
    if (ec) throw Error(class_dirs[c].string() + ": cannot list: " + ec.message());
    if (entries.empty())
      throw Error(class_dirs[c].string() + ": empty class folder (no .jpg, .jpeg or .png files)");
    std::sort(entries.begin(), entries.end());
    for (const auto& p : entries) {
      files.push_back(p.string());
      labels.push_back(static_cast<int64_t>(c));
    }
    classes.push_back(class_dirs[c].filename().string());
  }
  auto dataset = std::make_shared<ImageFolderDataset>(std::move(files), std::move(labels),
                                                      std::move(classes), options);
  std::sort(left_out.begin(), left_out.end());
  dataset->not_images_ = std::move(left_out);
  return dataset;
}

std::shared_ptr<ImageFolderDataset> ImageFolderDataset::from_list(
    const std::string& list_file, const ImageFolderOptions& options) {
  std::ifstream in(list_file);
  if (!in) throw Error(list_file + ": cannot read: " + std::strerror(errno));
  const fs::path base = fs::path(list_file).parent_path();
  std::vector<std::string> files;
  std::vector<int64_t> labels;
  int64_t max_label = -1;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (number == 1 && line == "path,label")) continue;
    const size_t comma = line.rfind(',');
    const std::string where = list_file + ":" + std::to_string(number);
    if (comma == std::string::npos || comma == 0)
      throw Error(where + ": expected 'path,label', got '" + one_line(line, 80) + "'");
    const std::string label_text = line.substr(comma + 1);
    char* end = nullptr;
    const long long label = std::strtoll(label_text.c_str(), &end, 10);
    if (label_text.empty() || *end != '\0' || label < 0)
      throw Error(where + ": label '" + one_line(label_text, 40) + "' is not an integer >= 0");
    const fs::path p = line.substr(0, comma);
    if (!image_name(p))
      throw Error(where + ": '" + one_line(p.string(), 80) +
                  "' is not an image file (expected .jpg, .jpeg or .png)");
    files.push_back((p.is_absolute() ? p : base / p).string());
    labels.push_back(label);
    max_label = std::max<int64_t>(max_label, label);
  }
  if (files.empty()) throw Error(list_file + ": no 'path,label' lines");
  std::vector<std::string> classes;
  for (int64_t c = 0; c <= max_label; ++c) classes.push_back(std::to_string(c));
  return std::make_shared<ImageFolderDataset>(std::move(files), std::move(labels),
                                              std::move(classes), options);
}

std::shared_ptr<ImageFolderDataset> ImageFolderDataset::from_webdataset(
    const std::vector<std::string>& shards, const ImageFolderOptions& options) {
  if (shards.empty()) throw Error("webdataset: no shards given");
  std::vector<std::string> names;
  std::vector<int64_t> labels;
  std::vector<uint32_t> shard_of;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t max_label = -1;
  std::ifstream labels_in;
  size_t open_shard = shards.size();
  for (const WebDatasetSample& sample : index_webdataset(shards)) {
    const std::string& shard = shards[sample.shard];
    const TarMember* image = nullptr;
    const TarMember* label = nullptr;
    std::string extensions;
    for (const auto& [ext, member] : sample.members) {
      std::string lower = ext;
      std::transform(lower.begin(), lower.end(), lower.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      if (image == nullptr && (lower == "jpg" || lower == "jpeg" || lower == "png"))
        image = &member;
      if (lower == "cls") label = &member;
      extensions += (extensions.empty() ? "" : ", ") + ext;
    }
    const std::string where = shard + ":" + one_line(sample.key, 120);
    if (image == nullptr)
      throw Error(where + ": sample has no image member (.jpg, .jpeg or .png); its members: " +
                  one_line(extensions, 120));
    if (label == nullptr)
      throw Error(where +
                  ": sample has no label member (.cls); its members: " + one_line(extensions, 120));
    if (label->size > 32)
      throw Error(shard + ":" + one_line(label->name, 120) + ": a label of " +
                  std::to_string(label->size) + " bytes (expected an integer >= 0 as text)");
    // The labels are read through one open stream per shard (samples come in shard order), not
    // one open per label.
    if (open_shard != sample.shard) {
      labels_in = std::ifstream(shard, std::ios::binary);
      open_shard = sample.shard;
    }
    std::string text(static_cast<size_t>(label->size), '\0');
    if (!labels_in.seekg(label->offset) || !labels_in.read(text.data(), label->size))
      throw Error(shard + ":" + one_line(label->name, 120) + ": cannot read " +
                  std::to_string(label->size) + " bytes at byte " + std::to_string(label->offset) +
                  " (the shard changed or is truncated)");
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    char* end = nullptr;
    const long long value = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || value < 0)
      throw Error(shard + ":" + one_line(label->name, 120) + ": label '" + one_line(text, 40) +
                  "' is not an integer >= 0");
    names.push_back(shard + ":" + image->name);
    labels.push_back(value);
    shard_of.push_back(static_cast<uint32_t>(sample.shard));
    ranges.emplace_back(image->offset, image->size);
    max_label = std::max<int64_t>(max_label, value);
  }
  std::vector<std::string> classes;
  for (int64_t c = 0; c <= max_label; ++c) classes.push_back(std::to_string(c));
  auto out = std::make_shared<ImageFolderDataset>(std::move(names), std::move(labels),
                                                  std::move(classes), options);
  out->shards_ = shards;
  out->shard_of_ = std::move(shard_of);
  out->ranges_ = std::move(ranges);
  return out;
}

ImageFolderDataset::~ImageFolderDataset() {
  for (const auto& [index, fd] : opened_) ::close(fd);
}

std::string ImageFolderDataset::bytes_of(size_t index) const {
  if (ranges_.empty()) {
    int fd = -1;
    {
      std::lock_guard<std::mutex> lock(opened_mutex_);
      if (auto it = opened_.find(static_cast<int64_t>(index)); it != opened_.end()) {
        fd = it->second;
        opened_.erase(it);
      }
    }
    return fd >= 0 ? read_fd(fd, files_.at(index)) : read_file(files_.at(index));
  }
  const auto [offset, size] = ranges_.at(index);
  return read_file_range(shards_.at(shard_of_.at(index)), offset, size, files_.at(index));
}

std::vector<int64_t> ImageFolderDataset::shard_sizes() const {
  if (ranges_.empty()) return {size()};
  std::vector<int64_t> sizes(shards_.size(), 0);
  for (uint32_t s : shard_of_) ++sizes[s];
  return sizes;
}

std::pair<int64_t, int64_t> ImageFolderDataset::locate(int64_t index) const {
  if (ranges_.empty()) return {0, index};
  const auto i = static_cast<size_t>(index);
  return {static_cast<int64_t>(shard_of_.at(i)), ranges_.at(i).first};
}

void ImageFolderDataset::will_read(const std::vector<int64_t>& indices) const {
  auto advise = [](const std::string& path, int64_t offset, int64_t length) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return;  // get_batch reports it
    ::posix_fadvise(fd, offset, length, POSIX_FADV_WILLNEED);
    ::close(fd);
  };
  // Image files: opened here and handed, open, to the thread that decodes them (bytes_of), so a
  // hint costs a posix_fadvise, not another open; past max_open_ahead() files are closed again.
  if (ranges_.empty()) {
    for (int64_t index : indices) {
      const int fd =
          ::open(files_.at(static_cast<size_t>(index)).c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
      if (fd < 0) continue;  // get_batch reports it
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
      std::lock_guard<std::mutex> lock(opened_mutex_);
      if (opened_.size() >= max_open_ahead() || !opened_.emplace(index, fd).second) ::close(fd);
    }
    return;
  }
  // Runs of examples in one shard: one range from the first byte to the last.
  size_t i = 0;
  while (i < indices.size()) {
    const uint32_t shard = shard_of_.at(static_cast<size_t>(indices[i]));
    int64_t lo = INT64_MAX, hi = 0;
    for (; i < indices.size() && shard_of_.at(static_cast<size_t>(indices[i])) == shard; ++i) {
      const auto [offset, size] = ranges_.at(static_cast<size_t>(indices[i]));
      lo = std::min(lo, offset);
      hi = std::max(hi, offset + size);
    }
    advise(shards_.at(shard), lo, hi - lo);
  }
}

int64_t ImageFolderDataset::bad_files() const {
  std::lock_guard<std::mutex> lock(bad_mutex_);
  return static_cast<int64_t>(bad_.size());
}

Batch ImageFolderDataset::get_batch(const std::vector<int64_t>& indices) const {
  return build(indices, nullptr);
}

Batch ImageFolderDataset::get_batch(const std::vector<int64_t>& indices, at::Generator& gen) const {
  return build(indices, &gen);
}

Batch ImageFolderDataset::build(const std::vector<int64_t>& indices, at::Generator* gen) const {
  torch::NoGradGuard no_grad;
  const int64_t s = options_.image_size;
  const bool random = gen != nullptr && options_.train;
  std::unique_lock<std::mutex> gen_lock;
  Draw draw{nullptr};
  if (random) {
    gen_lock = std::unique_lock<std::mutex>(gen->mutex());
    draw.g = gen->get<at::CPUGeneratorImpl>();
  }
  auto images = torch::empty({static_cast<int64_t>(indices.size()), 3, s, s}, torch::kUInt8);
  std::vector<int64_t> targets;
  int64_t n = 0;
  for (int64_t index : indices) {
    const std::string& file = files_.at(static_cast<size_t>(index));
    try {
      const std::string bytes = bytes_of(static_cast<size_t>(index));
      const ImageSize size =
          read_image_size(bytes.data(), bytes.size(), file, options_.max_image_pixels);
      const Box box = random
                          ? random_resized_crop(size.height, size.width, options_.scale_min, draw)
                          : centre_crop(size.height, size.width, s, options_.eval_crop_ratio);
      const bool flip = random && draw.uniform(0, 1) < 0.5;
      // Decode no smaller than what keeps the crop at S pixels or more on each side.
      const int64_t min_w = options_.dct_scaling ? (size.width * s + box.width - 1) / box.width : 0;
      const int64_t min_h =
          options_.dct_scaling ? (size.height * s + box.height - 1) / box.height : 0;
      const torch::Tensor hwc =
          decode_image(bytes.data(), bytes.size(), file, min_w, min_h, options_.max_image_pixels);
      // The box in decoded pixels (a JPEG may have been decoded at 1/2, 1/4 or 1/8 scale).
      const double sy = static_cast<double>(hwc.size(0)) / static_cast<double>(size.height);
      const double sx = static_cast<double>(hwc.size(1)) / static_cast<double>(size.width);
      const int64_t top = std::llround(static_cast<double>(box.top) * sy);
      const int64_t left = std::llround(static_cast<double>(box.left) * sx);
      const int64_t ch = std::clamp<int64_t>(std::llround(static_cast<double>(box.height) * sy), 1,
                                             hwc.size(0) - top);
      const int64_t cw = std::clamp<int64_t>(std::llround(static_cast<double>(box.width) * sx), 1,
                                             hwc.size(1) - left);
      // [1, 3, h, w] over the HWC pixels: channels-last, what the uint8 antialias kernel wants.
      torch::Tensor crop =
          hwc.narrow(0, top, ch).narrow(1, left, cw).permute({2, 0, 1}).unsqueeze(0);
      if (ch != s || cw != s) {
        crop = torch::nn::functional::interpolate(crop.contiguous(at::MemoryFormat::ChannelsLast),
                                                  torch::nn::functional::InterpolateFuncOptions()
                                                      .size(std::vector<int64_t>{s, s})
                                                      .mode(torch::kBilinear)
                                                      .align_corners(false)
                                                      .antialias(true));
      }
      if (flip) crop = crop.flip(3);
      images[n].copy_(crop[0]);
      targets.push_back(labels_.at(static_cast<size_t>(index)));
      ++n;
    } catch (const Error& e) {
      if (!options_.skip_bad_files) throw;
      std::lock_guard<std::mutex> lock(bad_mutex_);
      if (bad_.insert(index).second)
        std::cerr << "warning: skipped " << e.what() << " (data.skip_bad_files)" << std::endl;
    }
  }
  if (n == 0 && !indices.empty())
    throw Error("every image of a batch of " + std::to_string(indices.size()) +
                " could not be read (data.skip_bad_files); first: " +
                files_.at(static_cast<size_t>(indices[0])));
  return {images.narrow(0, 0, n), torch::tensor(targets, torch::kInt64)};
}

}  // namespace fabric
