// The starting point of the port: a plain LibTorch MNIST trainer laid out as PyTorch's C++ MNIST
// example is (a small CNN, SGD with momentum, a test pass per epoch), written for this project.
// One process, one device; no resume, no logging, no launch modes.
//
// Usage: mnist_plain [DATA_ROOT] [--epochs=N] [--max_steps=N] [--sequential] [--save=FILE]
//   DATA_ROOT     the four uncompressed IDX files (MNIST or Fashion-MNIST); default ./data
//   --max_steps=N stop training after N > 0 batches in all (the test pass still runs)
//   --sequential  read the training set in order (default: torch's RandomSampler shuffles)
//   --save=FILE   write the weights (name -> tensor; Python's torch.load reads them) at the end
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

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

// Stops early when `steps_left` (-1: no limit) reaches 0.
template <typename Loader>
void train(size_t epoch, Net& model, torch::Device device, Loader& loader,
           torch::optim::Optimizer& optimizer, size_t dataset_size, int64_t& steps_left) {
  model.train();
  size_t batch_idx = 0;
  for (auto& batch : loader) {
    auto data = batch.data.to(device), targets = batch.target.to(device);
    optimizer.zero_grad();
    auto loss = torch::nll_loss(model.forward(data), targets);
    loss.backward();
    optimizer.step();
    if (batch_idx++ % 10 == 0)
      std::printf("Train Epoch: %zu [%5zu/%5zu] Loss: %.4f\n", epoch,
                  batch_idx * batch.data.size(0), dataset_size, loss.template item<float>());
    if (steps_left > 0 && --steps_left == 0) break;
  }
}

template <typename Loader>
void test(Net& model, torch::Device device, Loader& loader, size_t dataset_size) {
  torch::NoGradGuard no_grad;
  model.eval();
  double test_loss = 0;
  int64_t correct = 0;
  for (const auto& batch : loader) {
    auto data = batch.data.to(device), targets = batch.target.to(device);
    auto output = model.forward(data);
    test_loss +=
        torch::nll_loss(output, targets, {}, torch::Reduction::Sum).template item<double>();
    correct += output.argmax(1).eq(targets).sum().template item<int64_t>();
  }
  std::printf("Test set: Average loss: %.4f | Accuracy: %.3f\n", test_loss / dataset_size,
              static_cast<double>(correct) / dataset_size);
}

int main(int argc, char** argv) {
  std::string root = "./data", save;
  size_t epochs = 10;
  int64_t steps_left = -1;
  bool sequential = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--epochs=", 0) == 0)
      epochs = std::stoul(arg.substr(9));
    else if (arg.rfind("--max_steps=", 0) == 0)
      steps_left = std::stol(arg.substr(12));
    else if (arg == "--sequential")
      sequential = true;
    else if (arg.rfind("--save=", 0) == 0)
      save = arg.substr(7);
    else
      root = arg;
  }
  torch::manual_seed(1);
  torch::Device device(torch::cuda::is_available() ? torch::kCUDA : torch::kCPU);
  Net model;
  model.to(device);

  using torch::data::datasets::MNIST;
  auto train_dataset = MNIST(root)
                           .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                           .map(torch::data::transforms::Stack<>());
  const size_t train_size = train_dataset.size().value();
  auto test_dataset = MNIST(root, MNIST::Mode::kTest)
                          .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                          .map(torch::data::transforms::Stack<>());
  const size_t test_size = test_dataset.size().value();
  // In order: a RandomSampler (make_data_loader's default) draws a permutation from the global
  // generator at each pass, which moves every later dropout mask (docs/training.md).
  auto test_loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(test_dataset), 1000);
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.5));

  if (sequential) {
    auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
        std::move(train_dataset), 64);
    for (size_t epoch = 1; epoch <= epochs; ++epoch) {
      train(epoch, model, device, *loader, optimizer, train_size, steps_left);
      test(model, device, *test_loader, test_size);
    }
  } else {
    auto loader = torch::data::make_data_loader(std::move(train_dataset), 64);
    for (size_t epoch = 1; epoch <= epochs; ++epoch) {
      train(epoch, model, device, *loader, optimizer, train_size, steps_left);
      test(model, device, *test_loader, test_size);
    }
  }
  if (!save.empty()) {
    c10::Dict<std::string, torch::Tensor> weights;
    for (const auto& p : model.named_parameters()) weights.insert(p.key(), p.value().cpu());
    const std::vector<char> bytes = torch::pickle_save(weights);
    std::ofstream(save, std::ios::binary).write(bytes.data(), bytes.size());
  }
}
