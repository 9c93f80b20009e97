// A research program built with CMake against an installed Fabric++: an MLP learns which of two
// interleaved spirals a point lies on. Run with `fabric.strategy=ddp fabric.devices=2` it trains in
// two processes; at the end every rank checks that its parameters equal rank 0's bit for bit. It
// writes a run folder (logging.run_dir) with checkpoints (checkpoint.*).
// Usage: ddp_train [--config=FILE] [key=value ...]
// Exit status: 0 trained (accuracy >= 0.9) with identical replicas; 1 otherwise; 2 bad config.
#include <torch/torch.h>

#include <cmath>

#include "fabric/all.h"

namespace {

// n points of each spiral, 2 features, labels 0/1; the same on every rank (fixed seed).
fabric::TensorDataset two_spirals(int64_t n) {
  torch::manual_seed(0);
  auto t = torch::rand({n}) * 3 * M_PI + 0.5;
  auto noise = [&] { return 0.1 * torch::randn({n}); };
  auto a = torch::stack({t * torch::cos(t) + noise(), t * torch::sin(t) + noise()}, 1);
  auto b = -torch::stack({t * torch::cos(t) + noise(), t * torch::sin(t) + noise()}, 1);
  auto x = torch::cat({a, b}) / 10;
  auto y = torch::cat({torch::zeros({n}, torch::kLong), torch::ones({n}, torch::kLong)});
  return fabric::TensorDataset(x, y);
}

}  // namespace

int main(int argc, char** argv) {
  return fabric::run_main(argc, argv, fabric::training_schema(), [](const fabric::Config& config) {
    fabric::Fabric fabric(config);
    return fabric.launch([&](fabric::Fabric& f) {
      torch::nn::Sequential model(torch::nn::Linear(2, 64), torch::nn::ReLU(),
                                  torch::nn::Linear(64, 64), torch::nn::ReLU(),
                                  torch::nn::Linear(64, 2));
      auto optimizer = fabric::make_optimizer(config, model->parameters());
      f.setup(model, *optimizer);
      auto dataset = two_spirals(1024);
      auto loader =
          f.setup_dataloader(dataset, fabric::DataLoaderOptions().batch_size(64).shuffle(true));
      // The run's folder (logging.run_dir) and checkpoints by the checkpoint: keys (every epoch,
      // the newest 3 kept; checkpoint.resume=auto continues the last run).
      fabric::RunDirectory run = f.create_run_directory("ddp_train");
      fabric::CheckpointState state;
      state.add("model", *model).add("optimizer", *optimizer).add("loader", loader);
      fabric::Checkpointer checkpoints(f, state, "ddp_train", run.path());
      for (int64_t epoch = checkpoints.epoch(); epoch < config.get_int("trainer.max_epochs");
           ++epoch) {
        for (fabric::Batch& batch : loader) {
          optimizer->zero_grad();
          f.backward(torch::cross_entropy_loss(model->forward(batch.data), batch.target));
          f.step(*optimizer);
          checkpoints.step_end();
        }
        checkpoints.epoch_end();
      }
      checkpoints.finish();
      // Every rank: accuracy on the whole set, and its parameters against rank 0's.
      torch::NoGradGuard no_grad;
      auto x = f.to_device(dataset.data());
      auto y = f.to_device(dataset.target());
      double accuracy = model->forward(x).argmax(1).eq(y).to(torch::kDouble).mean().item<double>();
      auto mine = torch::nn::utils::parameters_to_vector(model->parameters());
      auto same = mine.equal(f.broadcast(mine, 0)) ? 1.0 : 0.0;
      same = f.all_reduce(same, fabric::ReduceOp::kMin);
      f.print("ranks ", f.world_size(), ": replicas ", same == 1.0 ? "identical" : "DIFFERENT",
              ", accuracy ", accuracy);
      return same == 1.0 && accuracy >= 0.9 ? 0 : 1;
    });
  });
}
