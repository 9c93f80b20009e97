#include "examples/common/recipes.h"

#include "fabric/config/standard_keys.h"

namespace examples {

fabric::ConfigSchema cifar10_schema() {
  fabric::ConfigSchema s = fabric::training_schema();
  s.set_default("data.root", "data/cifar10");
  s.add("data.download",
        fabric::KeySpec::boolean(true).doc("download CIFAR-10 when data.root has none"));
  s.add("data.synthetic",
        fabric::KeySpec::boolean(false).doc("use the synthetic stand-in even if real data exists"));
  s.add("data.require_real",
        fabric::KeySpec::boolean(false).doc("fail instead of falling back to synthetic data"));
  s.add("data.augment",
        fabric::KeySpec::boolean(true).doc("random crop (pad 4) and horizontal flip"));
  s.add("data.synthetic_train_size", fabric::KeySpec::integer(50000).min(1));
  s.add("data.synthetic_test_size", fabric::KeySpec::integer(10000).min(1));
  s.section_doc("model", "ResNet-18, CIFAR variant.");
  s.add("model.width",
        fabric::KeySpec::integer(64).min(1).doc("channels of the first stage (64 = standard)"));
  s.add("model.activation_checkpointing",
        fabric::KeySpec::choice_list({"BasicBlock"}, {})
            .doc("module types whose activations are recomputed in backward instead of kept"));
  return s;
}

fabric::ConfigSchema fashion_mnist_schema() {
  fabric::ConfigSchema s = fabric::training_schema();
  s.set_default("data.root", "/usr/share/datasets/fashion-mnist");
  s.section_doc("model", "SmallCnn: two conv blocks and a two-layer head.");
  s.add("model.width", fabric::KeySpec::integer(32).min(1).doc("channels of the first conv block"));
  s.add("model.hidden", fabric::KeySpec::integer(128).min(1).doc("units of the hidden layer"));
  return s;
}

}  // namespace examples
