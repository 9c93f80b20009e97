// A 30-line research program on Fabric++: fit y = 3x - 1 with a linear model.
// Usage: train [--config=FILE] [key=value ...]; exits 0 when the loss fell below 1e-3.
#include <torch/torch.h>

#include "fabric/all.h"

int main(int argc, char** argv) {
  return fabric::run_main(argc, argv, fabric::training_schema(), [](const fabric::Config& config) {
    fabric::Fabric fabric(config);
    double loss_value = 0;
    fabric.launch([&](fabric::Fabric& f) {
      auto x = torch::linspace(-1, 1, 256).unsqueeze(1);
      auto dataset = fabric::TensorDataset(x, 3 * x - 1);
      torch::nn::Linear model(1, 1);
      auto optimizer = fabric::make_optimizer(config, model->parameters());
      f.setup(model, *optimizer);
      auto loader =
          f.setup_dataloader(dataset, fabric::DataLoaderOptions().batch_size(32).shuffle(true));
      for (int64_t epoch = 0; epoch < config.get_int("trainer.max_epochs"); ++epoch) {
        for (fabric::Batch& batch : loader) {
          optimizer->zero_grad();
          auto loss = torch::mse_loss(model->forward(batch.data), batch.target);
          f.backward(loss);
          f.step(*optimizer);
          loss_value = loss.item<double>();
        }
      }
      f.print("final loss ", loss_value);
    });
    return loss_value < 1e-3 ? 0 : 1;
  });
}
