// bazel run //examples:image_classifier -- data.root=DIR [--config=FILE] [key=value ...]
//
// ResNet-18 (the CIFAR variant: 3x3 stem, no max-pool, global average pooling, so any image size)
// trained on your own data in `data.root`, laid out as torchvision's ImageNet folder is (a train
// and a val split):
//   data.format: image_folder
//                       DIR/train/<class>/<image> and DIR/val/<class>/<image> (JPEG or PNG; classes
//                       are the folder names, sorted; the same in both splits), or DIR/train.csv
//                       and DIR/val.csv listing "path,label" lines (fabric/data/image_folder.h).
//                       Training images get a random resized crop to data.image_size and a flip;
//                       val images a resize and centre crop. Decoded by the loader's threads
//                       (data.num_workers); data.skip_bad_files leaves unreadable ones out, each
//                       with a warning, and counts them (summary.json: bad_files).
//   data.format: npy    DIR/train/inputs.npy + DIR/train/targets.npy and the same in DIR/val/ (or
//                       DIR/train.npz and DIR/val.npz holding arrays `inputs` and `targets`), as
//                       numpy.save / numpy.savez write them. Inputs: images [N, C, H, W],
//                       [N, H, W] (one channel) or [N, H, W, C] with C of 1, 3 or 4 (channels last,
//                       as PIL and OpenCV give them), any numeric dtype; the arrays are
//                       memory-mapped (fabric/data/npy.h). Targets: integer class labels [N].
//   data.format: webdataset
//                       WebDataset tar shards (fabric/data/webdataset.h): samples KEY.jpg (or
//                       .jpeg, .png) + KEY.cls (the label as text), in data.train_shards and
//                       data.val_shards (brace patterns such as train-{000..099}.tar, relative to
//                       DIR); by default every DIR/train/*.tar and DIR/val/*.tar. Decoded and
//                       augmented as image_folder's images.
//   data.format: auto   npy when DIR/train/inputs.npy or DIR/train.npz exists, webdataset when
//                       data.train_shards is set or DIR/train holds .tar files, else image_folder.
// The classes are 0 .. max(train labels). Inputs are normalized per channel with the mean and
// standard deviation of up to 4096 evenly spaced training images (512 for image files; printed).
// Extra config keys: data.format (auto), data.train_shards / data.val_shards (""),
// data.image_size (224), data.skip_bad_files (false),
// data.max_image_pixels (89478485), model.width (default 64). Exit status: fabric/main.h,
// and 3 when training stopped on non-finite losses (trainer.stop_on_nonfinite).
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "examples/common/classification.h"
#include "examples/common/models.h"
#include "fabric/core/paths.h"
#include "fabric/data/image_folder.h"
#include "fabric/data/npy.h"
#include "fabric/data/webdataset.h"
#include "fabric/fabric.h"
#include "fabric/main.h"

namespace fs = std::filesystem;

namespace {

fabric::ConfigSchema schema() {
  fabric::ConfigSchema s = fabric::training_schema();
  s.add("data.format",
        fabric::KeySpec::choice({"auto", "npy", "image_folder", "webdataset"}, "auto")
            .noun("a data format")
            .doc("npy: DIR/{train,val}/{inputs,targets}.npy or DIR/{train,val}.npz; image_folder: "
                 "DIR/{train,val}/<class>/<image> or DIR/{train,val}.csv; webdataset: tar shards "
                 "(data.train_shards, data.val_shards); auto: detected"));
  s.add("data.train_shards",
        fabric::KeySpec::string("").doc(
            "webdataset: the training shards, a brace pattern relative to data.root (e.g. "
            "train-{000..099}.tar); empty: every DIR/train/*.tar"));
  s.add("data.val_shards",
        fabric::KeySpec::string("").doc(
            "webdataset: the validation shards (as data.train_shards); empty: every "
            "DIR/val/*.tar"));
  s.add("data.image_size",
        fabric::KeySpec::integer(224).min(1).doc("image_folder: height and width of the crops"));
  s.add("data.skip_bad_files",
        fabric::KeySpec::boolean(false).doc(
            "image_folder: leave unreadable images out (a warning each) instead of stopping"));
  s.add("data.max_image_pixels",
        fabric::KeySpec::integer(fabric::kDefaultMaxImagePixels)
            .min(1)
            .doc("image_folder: larger images are errors (PIL's limit by default)"));
  s.section_doc("model", "ResNet-18, CIFAR variant (any image size).");
  s.add("model.width",
        fabric::KeySpec::integer(64).min(1).doc("channels of the first stage (64 = standard)"));
  return s;
}

// One split's arrays from DIR/<split>/{inputs,targets}.npy or DIR/<split>.npz.
std::shared_ptr<const fabric::NpyDataset> load_split(const fs::path& root,
                                                     const std::string& split) {
  const fs::path folder = root / split, archive = root / (split + ".npz");
  if (fs::exists(folder / "inputs.npy")) {
    return fabric::NpyDataset::open((folder / "inputs.npy").string(),
                                    (folder / "targets.npy").string());
  }
  if (fs::exists(archive)) {
    auto arrays = fabric::load_npz(archive.string());
    for (const char* name : {"inputs", "targets"}) {
      if (!arrays.count(name))
        throw fabric::Error(archive.string() + ": no array '" + name +
                            "' (np.savez(file, inputs=..., targets=...))");
    }
    return std::make_shared<fabric::NpyDataset>(arrays.at("inputs"), arrays.at("targets"),
                                                archive.string() + ":inputs",
                                                archive.string() + ":targets");
  }
  throw fabric::Error(root.string() + ": no " + split + " split: expected " +
                      (folder / "inputs.npy").string() + " (with targets.npy) or " +
                      archive.string());
}

// [N, C, H, W] from [N, H, W], [N, H, W, C] (C of 1, 3, 4 and H not) or [N, C, H, W] as float.
torch::Tensor as_nchw(const torch::Tensor& x) {
  torch::Tensor y = x;
  if (y.dim() == 3) y = y.unsqueeze(1);
  const auto c = y.size(3);
  if ((c == 1 || c == 3 || c == 4) && y.size(1) != 1 && y.size(1) != 3 && y.size(1) != 4)
    y = y.permute({0, 3, 1, 2});
  return y.to(torch::kFloat).contiguous();
}

// At most this many classes (labels 0 .. kMaxClasses - 1): a stray huge label would otherwise size
// the model's last layer (a label of 2**40: a 140 TB allocation).
constexpr int64_t kMaxClasses = int64_t{1} << 20;

// Class labels checked when the data opens, not when their batch comes: integers [N], none
// negative; train's at most kMaxClasses classes; val's within train's `classes` (> 0). Returns
// the number of classes (max label + 1). Errors name the file and the row.
int64_t check_labels(const fabric::NpyDataset& d, int64_t classes) {
  const std::string& file = d.targets_name();
  const torch::Tensor& y = d.targets();
  if (c10::isFloatingType(y.scalar_type()) || c10::isComplexType(y.scalar_type()))
    throw fabric::Error(file + ": labels are " + std::string(c10::toString(y.scalar_type())) +
                        "; class labels are integers (np.save(f, y.astype(np.int64)))");
  if (y.dim() != 1)
    throw fabric::Error(file + ": labels have shape " + c10::str(y.sizes()) +
                        "; class labels are one integer per row [N]");
  const auto at = [&](const torch::Tensor& row) {
    const int64_t r = row.item<int64_t>();
    return "label " + std::to_string(y[r].item<int64_t>()) + " at row " + std::to_string(r);
  };
  if (y.lt(0).any().item<bool>())
    throw fabric::Error(file + ": " + at(y.argmin()) + "; class labels are 0, 1, 2, ...");
  const int64_t max = y.max().item<int64_t>();
  if (classes < 0 && max >= kMaxClasses)
    throw fabric::Error(file + ": " + at(y.argmax()) + " would make " + std::to_string(max + 1) +
                        " classes (at most " + std::to_string(kMaxClasses) +
                        "); class labels are 0 .. C-1");
  if (classes >= 0 && max >= classes)
    throw fabric::Error(file + ": " + at(y.argmax()) + " is no class of the train split (0.." +
                        std::to_string(classes - 1) + ")");
  return max + 1;
}

struct Split {
  std::shared_ptr<const fabric::Dataset> train, val;
  int64_t classes = 0, channels = 0;
  torch::Tensor mean, std;                                                     // [1, C, 1, 1]
  std::shared_ptr<const fabric::ImageFolderDataset> train_images, val_images;  // image_folder
};

bool has_npy(const fs::path& root) {
  return fs::exists(root / "train" / "inputs.npy") || fs::exists(root / "train.npz");
}

// The .tar files directly in `folder`, sorted (none when it is not a folder).
std::vector<std::string> tar_files(const fs::path& folder) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return out;
  for (const auto& entry : fs::directory_iterator(folder, ec))
    if (entry.path().extension() == ".tar" && entry.is_regular_file(ec))
      out.push_back(entry.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The shards of `split` (data.<split>_shards expanded against DIR, else DIR/<split>/*.tar).
std::vector<std::string> shards_of(const fabric::Config& c, const fs::path& root,
                                   const std::string& split) {
  const std::string key = "data." + split + "_shards";
  const std::string pattern = c.get_string(key);
  if (pattern.empty()) {
    auto found = tar_files(root / split);
    if (found.empty())
      throw c.error_at(key, "no shards: set it (e.g. " + split + "-{000..009}.tar) or put " +
                                (root / split).string() + "/*.tar");
    return found;
  }
  std::vector<std::string> out;
  try {
    for (const auto& name : fabric::expand_braces(pattern)) {
      const fs::path p = fs::path(name).is_absolute() ? fs::path(name) : root / name;
      if (!fs::exists(p))
        throw fabric::Error(p.string() + " does not exist (one of the shards '" + pattern +
                            "' names)");
      out.push_back(p.string());
    }
  } catch (const fabric::Error& e) {
    throw c.error_at(key, e.what());
  }
  return out;
}

bool has_shards(const fabric::Config& c, const fs::path& root) {
  return !c.get_string("data.train_shards").empty() || !tar_files(root / "train").empty();
}

// DIR/<split>.csv, else the class folders DIR/<split>/; the split's shards for webdataset.
std::shared_ptr<const fabric::ImageFolderDataset> image_split(const fabric::Config& c,
                                                              const fs::path& root,
                                                              const std::string& split,
                                                              fabric::ImageFolderOptions options,
                                                              bool shards) {
  if (shards)
    return fabric::ImageFolderDataset::from_webdataset(shards_of(c, root, split), options);
  const fs::path list = root / (split + ".csv");
  if (fs::exists(list)) return fabric::ImageFolderDataset::from_list(list.string(), options);
  if (!fs::is_directory(root / split)) {
    throw fabric::Error(root.string() + ": no " + split + " split: expected " +
                        (root / split).string() + "/<class>/<images> or " + list.string());
  }
  return fabric::ImageFolderDataset::from_folder((root / split).string(), options);
}

Split load_data(const fabric::Config& c, fabric::Fabric& f) {
  const fs::path root = fabric::absolute_from_working_directory(c.get_string("data.root"));
  if (c.get_string("data.root").empty())
    throw c.error_at("data.root", "set it to your data folder, e.g. data.root=DIR");
  if (!fs::is_directory(root)) throw c.error_at("data.root", root.string() + " is not a folder");
  const std::string format = c.get_string("data.format");
  Split s;
  torch::Tensor sample;  // float [n, C, H, W]: what the normalization is computed from
  if (format == "npy" || (format == "auto" && has_npy(root))) {
    auto train = load_split(root, "train");
    auto val = load_split(root, "val");
    for (const auto* split : {train.get(), val.get()})
      if (split->size() == 0)
        throw fabric::Error(split->inputs_name() + ": the " +
                            (split == train.get() ? "train" : "val") + " split holds no examples");
    s.val = val;
    const auto& inputs = train->inputs();
    if (inputs.dim() < 3 || inputs.dim() > 4) {
      throw fabric::Error(root.string() + ": train inputs have shape " + c10::str(inputs.sizes()) +
                          "; expected images [N, C, H, W], [N, H, W] or [N, H, W, C]");
    }
    s.classes = check_labels(*train, -1);
    check_labels(*val, s.classes);
    const int64_t n = train->size(), count = std::min<int64_t>(n, 4096);
    const auto rows = torch::linspace(0, static_cast<double>(n - 1), count).to(torch::kInt64);
    sample = as_nchw(inputs.index_select(0, rows));
    s.train = train;
  } else {
    fabric::ImageFolderOptions options;
    options.image_size = c.get_int("data.image_size");
    options.skip_bad_files = c.get_bool("data.skip_bad_files");
    options.max_image_pixels = c.get_int("data.max_image_pixels");
    const bool shards = format == "webdataset" || (format == "auto" && has_shards(c, root));
    s.train_images = image_split(c, root, "train", options, shards);
    options.train = false;
    s.val_images = image_split(c, root, "val", options, shards);
    if (s.val_images->classes() != s.train_images->classes() && !shards &&
        !fs::exists(root / "train.csv")) {
      throw fabric::Error(root.string() + ": the val split's class folders differ from train's (" +
                          std::to_string(s.val_images->classes().size()) + " vs " +
                          std::to_string(s.train_images->classes().size()) + ")");
    }
    s.classes = static_cast<int64_t>(s.train_images->classes().size());
    for (const auto* images : {s.train_images.get(), s.val_images.get()}) {
      const auto& skipped = images->not_images();
      if (skipped.empty()) continue;
      f.print("image_classifier: left out ", skipped.size(), " non-image file",
              skipped.size() == 1 ? "" : "s",
              ", as torchvision's ImageFolder does (first: ", skipped.front(), ")");
    }
    const int64_t n = s.train_images->size(), count = std::min<int64_t>(n, 512);
    std::vector<int64_t> rows;
    for (int64_t i = 0; i < count; ++i) rows.push_back(count > 1 ? i * (n - 1) / (count - 1) : 0);
    sample = s.train_images->get_batch(rows).data.to(torch::kFloat);  // the val pipeline
    s.train = s.train_images;
    s.val = s.val_images;
  }
  s.channels = sample.size(1);
  s.mean = sample.mean({0, 2, 3}, /*keepdim=*/true);
  s.std = sample.std({0, 2, 3}, /*unbiased=*/false, /*keepdim=*/true).clamp_min(1e-6);
  auto list = [](const torch::Tensor& t) {
    std::string out;
    for (int64_t i = 0; i < t.numel(); ++i)
      out += (i ? ", " : "") + c10::str(std::round(t.flatten()[i].item<double>() * 1e4) / 1e4);
    return "[" + out + "]";
  };
  f.print("image_classifier: ", root.string(), ": ", s.train->size(), " train / ", s.val->size(),
          " val images ", c10::str(sample.sizes().slice(1)), ", ", s.classes,
          " classes; normalized with mean ", list(s.mean), ", std ", list(s.std));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  return fabric::run_main(argc, argv, schema(), [](const fabric::Config& config) {
    fabric::Fabric fabric(config);
    return fabric.launch([&](fabric::Fabric& f) {
      const Split data = load_data(config, f);
      auto model = f.init_module([&] {
        return examples::ResNet18Cifar(config.get_int("model.width"), data.classes, data.channels);
      });
      const torch::Tensor mean = data.mean, std = data.std;
      fabric::BatchTransform normalize = [mean, std](fabric::Batch b, at::Generator&) {
        b.data = (as_nchw(b.data) - mean) / std;
        return b;
      };
      examples::ClassificationTask task{"image_classifier", data.train, data.val, "real",
                                        normalize,          normalize};
      if (data.train_images) {  // data.skip_bad_files: how many were left out, over all ranks
        task.finish = [&data](fabric::Fabric& fab, nlohmann::json& summary) {
          const auto bad = static_cast<int64_t>(fab.all_reduce(
              static_cast<double>(data.train_images->bad_files() + data.val_images->bad_files()),
              fabric::ReduceOp::kSum));
          if (bad > 0) fab.print("skipped ", bad, " unreadable image files (data.skip_bad_files)");
          summary["bad_files"] = bad;
        };
      }
      return examples::train_classifier(f, model, task);
    });
  });
}
