// The classification examples' configurations (examples/cifar10.cc, examples/fashion_mnist.cc;
// tools/estimate_memory builds their models from the same keys): training_schema() plus each
// program's data.* and model.* keys.
#ifndef EXAMPLES_COMMON_RECIPES_H_
#define EXAMPLES_COMMON_RECIPES_H_

#include "fabric/config/schema.h"

namespace examples {

fabric::ConfigSchema cifar10_schema();        // model.width: ResNet18Cifar
fabric::ConfigSchema fashion_mnist_schema();  // model.width, model.hidden: SmallCnn

}  // namespace examples

#endif  // EXAMPLES_COMMON_RECIPES_H_
