// plain/mnist.cc ported onto Fabric++: the same model, optimizer and data, and it gains every
// launch mode (CPU, GPUs, ddp/fsdp/ZeRO-1 over N processes or nodes, torchrun/srun), precision by
// config, checkpoints with rotation and exact resume (checkpoint.resume=auto), restarts, a run
// folder with metrics.csv and summary.json. Trains bitwise like plain/mnist.cc --sequential with
// data.shuffle=false (docs/training.md, "Bitwise parity with a plain LibTorch loop").
//
// Usage: mnist [--config=FILE] [key=value ...], e.g. mnist data.root=DIR fabric.devices=2
#include <torch/torch.h>

#include "fabric/all.h"

struct Net : torch::nn::Module {
  Net()
      : conv1(torch::nn::Conv2dOptions(1, 10, 5)),
        conv2(torch::nn::Conv2dOptions(10, 20, 5)),
        fc1(320, 50),
        fc2(50, 10) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv2_drop", conv2_drop);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, 0.5, is_training());
    return torch::log_softmax(fc2->forward(x), 1);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Dropout2d conv2_drop;
  torch::nn::Linear fc1, fc2;
};

fabric::ConfigSchema schema() {  // the plain program's constants, now keys with these defaults
  fabric::ConfigSchema s = fabric::training_schema();
  for (auto [key, value] : {std::pair{"data.root", "data"},
                            {"data.batch_size", "64"},
                            {"optimizer.lr", "0.01"},
                            {"optimizer.momentum", "0.5"},
                            {"fabric.seed", "1"},
                            {"checkpoint.every_n_steps", "200"}})
    s.set_default(key, value);
  return s;
}

auto mnist(const std::string& root, torch::data::datasets::MNIST::Mode mode) {
  return torch::data::datasets::MNIST(root, mode)
      .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
      .map(torch::data::transforms::Stack<>());
}

int main(int argc, char** argv) {
  return fabric::run_main(argc, argv, schema(), [](const fabric::Config& c) {
    fabric::Fabric fabric(c);
    return fabric.launch([&](fabric::Fabric& f) {
      using Mode = torch::data::datasets::MNIST::Mode;
      const std::string root = c.get_string("data.root");
      auto train = f.setup_dataloader(mnist(root, Mode::kTrain),
                                      fabric::DataLoaderOptions()
                                          .batch_size(c.get_int("data.batch_size"))
                                          .shuffle(c.get_bool("data.shuffle")));
      auto test = f.setup_dataloader(mnist(root, Mode::kTest),
                                     fabric::DataLoaderOptions().batch_size(1000));
      Net model;
      torch::optim::SGD optimizer(model.parameters(),
                                  torch::optim::SGDOptions(c.get_double("optimizer.lr"))
                                      .momentum(c.get_double("optimizer.momentum")));
      f.setup(model, optimizer);
      fabric::CheckpointState state;
      state.add("model", model).add("optimizer", optimizer).add("train", train);
      fabric::Checkpointer checkpoints(f, state);  // in the run folder; resumes per config
      // trainer.max_steps (-1: whole epochs) may end the run inside an epoch; its checkpoint
      // keeps the loader's place, so a resumed run with a larger bound goes on from there.
      const int64_t max_steps = c.get_int("trainer.max_steps");
      const auto done = [&] { return max_steps >= 0 && checkpoints.step() >= max_steps; };
      for (int64_t epoch = checkpoints.epoch(); epoch < c.get_int("trainer.max_epochs") && !done();
           ++epoch) {
        model.train();
        for (fabric::Batch& batch : train) {
          optimizer.zero_grad();
          auto loss = torch::nll_loss(model.forward(batch.data), batch.target);
          f.backward(loss);
          f.step(optimizer);
          checkpoints.step_end();
          if (checkpoints.step() % 10 == 0) f.log("train/loss", loss, checkpoints.step());
          if (done()) break;
        }
        model.eval();
        auto metrics = f.evaluate(test, [&](const fabric::Batch& b) {
          auto output = model.forward(b.data);
          return std::map<std::string, torch::Tensor>{
              {"test/loss", torch::nll_loss(output, b.target, {}, torch::Reduction::None)},
              {"test/accuracy", output.argmax(1).eq(b.target)}};
        });
        f.print("epoch ", epoch + 1, ": test loss ", metrics["test/loss"], ", accuracy ",
                metrics["test/accuracy"]);
        f.log_dict(metrics, checkpoints.step());
        // An epoch that max_steps cut short is not counted: a resumed run goes on inside it.
        const fabric::DataLoader::State at = train.state();
        if (at.batches == 0 || at.batches == train.size()) checkpoints.epoch_end();
      }
      checkpoints.finish();  // the last checkpoint, and the weights to <run dir>/weights.pt
    });
  });
}
