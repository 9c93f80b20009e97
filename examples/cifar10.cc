// bazel run //examples:cifar10 -- --config=single_cpu.yaml [key=value ...]
//
// ResNet-18 (CIFAR variant: 3x3 stem, no max-pool) with BatchNorm on CIFAR-10, SGD with Nesterov
// momentum and weight decay, a per-step LR schedule, random crop (pad 4) + flip + normalize, and
// evaluation on the test split.
//
// Data: `data.root` (default data/cifar10, relative to where the command was run) holding the
// binary batches (cifar-10-batches-bin/). If absent and data.download is true, the official
// archive is downloaded with curl; if that fails, a deterministic synthetic CIFAR-format dataset is
// used with a banner saying so. data.synthetic=true forces it; data.require_real=true makes missing
// data an error.
// Extra config keys: model.width (default 64), data.download, data.synthetic, data.require_real,
// data.augment, data.synthetic_train_size, data.synthetic_test_size. Exit status: fabric/main.h,
// and 3 when training stopped on non-finite losses (trainer.stop_on_nonfinite).
#include <iostream>

#include "examples/common/classification.h"
#include "examples/common/image_data.h"
#include "examples/common/models.h"
#include "examples/common/recipes.h"
#include "fabric/core/paths.h"
#include "fabric/data/augment.h"
#include "fabric/fabric.h"
#include "fabric/main.h"

namespace {

const std::vector<double> kMean = {0.4914, 0.4822, 0.4465};
const std::vector<double> kStd = {0.2470, 0.2435, 0.2616};

examples::ImageSplits load_data(const fabric::Config& c, fabric::Fabric& f) {
  const auto root = fabric::absolute_from_working_directory(c.get_string("data.root"));
  const auto synthetic = [&] {
    return examples::synthetic_cifar10(c.get_int("data.synthetic_train_size"),
                                       c.get_int("data.synthetic_test_size"));
  };
  if (c.get_bool("data.synthetic")) return synthetic();
  if (examples::has_cifar10(root)) return examples::load_cifar10(root);
  std::string why = "CIFAR-10 not found in " + root.string();
  if (c.get_bool("data.download")) {
    // One process downloads; the others wait for it (a no-op barrier with one process).
    std::string failure;
    if (f.is_global_zero()) {
      f.print("CIFAR-10 not found in ", root.string(), "; downloading the official archive ...");
      failure = examples::download_cifar10(root);
    }
    f.barrier();
    if (examples::has_cifar10(root)) return examples::load_cifar10(root);
    why += "; " + (failure.empty() ? std::string("download failed on rank 0") : failure);
  }
  if (c.get_bool("data.require_real")) {
    throw c.error_at("data.require_real",
                     why + " (set data.root to a folder with cifar-10-batches-bin/)");
  }
  f.print(
      "=====================================================================================\n",
      "  ", why, ".\n",
      "  Training on a deterministic SYNTHETIC CIFAR-format dataset: accuracy is not CIFAR-10's.\n",
      "  Real data: curl -O https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz && mkdir -p ",
      root.string(), " && tar -xzf cifar-10-binary.tar.gz -C ", root.string(), "\n",
      "  (or set data.root; data.require_real=true turns this fallback into an error)\n",
      "=====================================================================================");
  return synthetic();
}

}  // namespace

int main(int argc, char** argv) {
  return fabric::run_main(argc, argv, examples::cifar10_schema(), [](const fabric::Config& config) {
    fabric::Fabric fabric(config);
    return fabric.launch([&](fabric::Fabric& f) {
      const auto data = load_data(config, f);
      auto model =
          f.init_module([&] { return examples::ResNet18Cifar(config.get_int("model.width")); });
      for (const auto& type : config.get_string_list("model.activation_checkpointing"))
        if (type == "BasicBlock") model->checkpoint_blocks = true;
      const auto train_transform = config.get_bool("data.augment")
                                       ? fabric::crop_flip_normalize(4, kMean, kStd)
                                       : fabric::normalize_images(kMean, kStd);
      return examples::train_classifier(f, model,
                                        {"cifar10", data.train, data.test, data.kind,
                                         train_transform, fabric::normalize_images(kMean, kStd)});
    });
  });
}
