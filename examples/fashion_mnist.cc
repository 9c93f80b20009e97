// bazel run //examples:fashion_mnist -- --config=fashion_mnist.yaml [key=value ...]
//
// A small CNN with BatchNorm on Fashion-MNIST (real data from the Debian package
// dataset-fashion-mnist, /usr/share/datasets/fashion-mnist; `data.root` overrides).
// Extra config keys: model.width (channels of the first conv block, default 32), model.hidden
// (units of the hidden layer, default 128). Exit status: see fabric/main.h; 3 when training
// stopped on non-finite losses (trainer.stop_on_nonfinite).
#include "examples/common/classification.h"
#include "examples/common/image_data.h"
#include "examples/common/models.h"
#include "examples/common/recipes.h"
#include "fabric/core/paths.h"
#include "fabric/data/augment.h"
#include "fabric/fabric.h"
#include "fabric/main.h"

namespace {}  // namespace

int main(int argc, char** argv) {
  return fabric::run_main(
      argc, argv, examples::fashion_mnist_schema(), [](const fabric::Config& config) {
        fabric::Fabric fabric(config);
        return fabric.launch([&](fabric::Fabric& f) {
          const auto data = examples::load_fashion_mnist(
              fabric::absolute_from_working_directory(config.get_string("data.root")));
          auto model = f.init_module([&] {
            return examples::SmallCnn(config.get_int("model.width"),
                                      config.get_int("model.hidden"));
          });
          const auto norm = fabric::normalize_images({0.2860}, {0.3530});
          return examples::train_classifier(
              f, model, {"fashion_mnist", data.train, data.test, data.kind, norm, norm});
        });
      });
}
