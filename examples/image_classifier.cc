// bazel run //examples:image_classifier -- data.root=DIR [--config=FILE] [key=value ...]
//
// ResNet-18 (the CIFAR variant: 3x3 stem, no max-pool, global average pooling, so any image size)
// trained on your own data in `data.root`, laid out as torchvision's ImageNet folder is (a train
// and a val split):
//   data.format: npy    DIR/train/inputs.npy + DIR/train/targets.npy and the same in DIR/val/ (or
//                       DIR/train.npz and DIR/val.npz holding arrays `inputs` and `targets`), as
//                       numpy.save / numpy.savez write them. Inputs: images [N, C, H, W],
//                       [N, H, W] (one channel) or [N, H, W, C] with C of 1, 3 or 4 (channels last,
//                       as PIL and OpenCV give them), any numeric dtype; the arrays are
//                       memory-mapped (fabric/data/npy.h). Targets: integer class labels [N].
//   data.format: auto   npy when DIR/train/inputs.npy or DIR/train.npz exists.
// The classes are 0 .. max(train labels). Inputs are normalized per channel with the mean and
// standard deviation of up to 4096 evenly spaced training images (printed).
// Extra config keys: data.format (auto), model.width (default 64). Exit status: fabric/main.h,
// and 3 when training stopped on non-finite losses (trainer.stop_on_nonfinite).
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "examples/common/classification.h"
#include "examples/common/models.h"
#include "fabric/core/paths.h"
#include "fabric/data/npy.h"
#include "fabric/fabric.h"
#include "fabric/main.h"

namespace fs = std::filesystem;

namespace {

fabric::ConfigSchema schema() {
  fabric::ConfigSchema s = fabric::training_schema();
  s.add("data.format", fabric::KeySpec::choice({"auto", "npy"}, "auto")
                           .noun("a data format")
                           .doc("npy: DIR/{train,val}/{inputs,targets}.npy or DIR/{train,val}.npz; "
                                "auto: detected from DIR"));
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

struct Split {
  std::shared_ptr<const fabric::NpyDataset> train, val;
  int64_t classes = 0, channels = 0;
  torch::Tensor mean, std;  // [1, C, 1, 1]
};

Split load_data(const fabric::Config& c, fabric::Fabric& f) {
  const fs::path root = fabric::absolute_from_working_directory(c.get_string("data.root"));
  if (c.get_string("data.root").empty())
    throw c.error_at("data.root", "set it to your data folder, e.g. data.root=DIR");
  if (!fs::is_directory(root)) throw c.error_at("data.root", root.string() + " is not a folder");
  Split s;
  s.train = load_split(root, "train");
  s.val = load_split(root, "val");
  const auto& inputs = s.train->inputs();
  if (inputs.dim() < 3 || inputs.dim() > 4) {
    throw fabric::Error(root.string() + ": train inputs have shape " + c10::str(inputs.sizes()) +
                        "; expected images [N, C, H, W], [N, H, W] or [N, H, W, C]");
  }
  if (s.train->targets().dim() != 1)
    throw fabric::Error(root.string() + ": train targets must be class labels [N]");
  s.classes = s.train->targets().max().item<int64_t>() + 1;
  const int64_t n = s.train->size(), sample = std::min<int64_t>(n, 4096);
  const auto rows = torch::linspace(0, static_cast<double>(n - 1), sample).to(torch::kInt64);
  const torch::Tensor x = as_nchw(inputs.index_select(0, rows));
  s.channels = x.size(1);
  s.mean = x.mean({0, 2, 3}, /*keepdim=*/true);
  s.std = x.std({0, 2, 3}, /*unbiased=*/false, /*keepdim=*/true).clamp_min(1e-6);
  auto list = [](const torch::Tensor& t) {
    std::string out;
    for (int64_t i = 0; i < t.numel(); ++i)
      out += (i ? ", " : "") + c10::str(std::round(t.flatten()[i].item<double>() * 1e4) / 1e4);
    return "[" + out + "]";
  };
  f.print("image_classifier: ", root.string(), ": ", n, " train / ", s.val->size(), " val images ",
          c10::str(x.sizes().slice(1)), " (", inputs.scalar_type(), "), ", s.classes,
          " classes; normalized with mean ", list(s.mean), ", std ", list(s.std));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  return fabric::run_main(argc, argv, schema(), [](const fabric::Config& config) {
    fabric::Fabric fabric(config);
    return fabric.launch([&](fabric::Fabric& f) {
      const Split data = load_data(config, f);
      examples::ResNet18Cifar model(config.get_int("model.width"), data.classes, data.channels);
      const torch::Tensor mean = data.mean, std = data.std;
      fabric::BatchTransform normalize = [mean, std](fabric::Batch b, at::Generator&) {
        b.data = (as_nchw(b.data) - mean) / std;
        return b;
      };
      return examples::train_classifier(
          f, model, {"image_classifier", data.train, data.val, "real", normalize, normalize});
    });
  });
}
