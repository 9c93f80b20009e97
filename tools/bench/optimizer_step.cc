// Optimizer step time: torch::optim's per-parameter loop vs fabric's foreach and fused steps
// (fabric/training/fast_optimizers.h), on the parameter shapes of a real model.
//   optimizer_step [--model=resnet18|mlp] [--reps=9] [--steps=20] [--threads=1] [--device=cpu]
//                  [--json=FILE]
// Each repetition times `steps` steps of every (optimizer, implementation) pair, interleaved,
// order rotated per repetition; prints the median µs per step and the ratio to for_loop.
#include <gflags/gflags.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "examples/common/models.h"
#include "fabric/training/fast_optimizers.h"

DEFINE_string(model, "resnet18", "resnet18 (ResNet-18 CIFAR, 11.2M parameters, 62 tensors) | mlp");
DEFINE_int32(reps, 9, "repetitions (medians over them)");
DEFINE_int32(steps, 20, "steps per repetition and variant");
DEFINE_int32(threads, 1, "intra-op threads");
DEFINE_string(device, "cpu", "cpu | cuda");
DEFINE_string(json, "", "also write the results here");

namespace {

std::vector<torch::Tensor> model_parameters(const torch::Device& device) {
  std::shared_ptr<torch::nn::Module> model;
  if (FLAGS_model == "mlp") {
    model = torch::nn::Sequential(torch::nn::Linear(1024, 2048), torch::nn::ReLU(),
                                  torch::nn::Linear(2048, 1024))
                .ptr();
  } else {
    model = examples::ResNet18Cifar(64).ptr();
  }
  std::vector<torch::Tensor> params;
  for (auto& p : model->parameters()) {
    auto q = p.detach().to(device).requires_grad_();
    q.mutable_grad() = torch::randn_like(q) * 1e-3;
    params.push_back(q);
  }
  return params;
}

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::randn({1}, device).item<float>();  // waits for queued work
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  at::set_num_threads(FLAGS_threads);
  const torch::Device device(FLAGS_device);
  using fabric::OptimizerImpl;
  struct Variant {
    std::string name;
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    std::vector<torch::Tensor> params;
    std::vector<double> us;
  };
  std::vector<Variant> variants;
  for (const std::string opt : {"sgd", "adamw"}) {
    for (OptimizerImpl impl :
         {OptimizerImpl::kForLoop, OptimizerImpl::kForeach, OptimizerImpl::kFused}) {
      Variant v;
      v.name = opt + "/" + fabric::optimizer_impl_name(impl);
      v.params = model_parameters(device);
      if (opt == "sgd") {
        v.optimizer = std::make_unique<fabric::SGD>(
            v.params, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(5e-4),
            impl);
      } else {
        v.optimizer = std::make_unique<fabric::AdamW>(
            v.params, torch::optim::AdamWOptions(1e-3).weight_decay(0.05), impl);
      }
      v.optimizer->step();  // state allocated outside the timing
      variants.push_back(std::move(v));
    }
  }
  for (int rep = 0; rep < FLAGS_reps; ++rep) {
    for (size_t i = 0; i < variants.size(); ++i) {
      Variant& v = variants[(i + rep) % variants.size()];
      sync(device);
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < FLAGS_steps; ++s) v.optimizer->step();
      sync(device);
      const auto t1 = std::chrono::steady_clock::now();
      v.us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / FLAGS_steps);
    }
  }
  auto median = [](std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
  };
  std::map<std::string, double> result;
  std::printf("| variant | µs/step (median of %d) | vs for_loop |\n| --- | --- | --- |\n",
              FLAGS_reps);
  for (const auto& v : variants) {
    const std::string base = v.name.substr(0, v.name.find('/')) + "/for_loop";
    double base_us = 0;
    for (const auto& w : variants)
      if (w.name == base) base_us = median(w.us);
    result[v.name] = median(v.us);
    std::printf("| %s | %.1f | %.3f |\n", v.name.c_str(), median(v.us), median(v.us) / base_us);
  }
  if (!FLAGS_json.empty()) {
    std::ofstream out(FLAGS_json);
    out << "{\"model\": \"" << FLAGS_model << "\", \"device\": \"" << FLAGS_device
        << "\", \"threads\": " << FLAGS_threads << ", \"us_per_step\": {";
    bool first = true;
    for (const auto& [k, us] : result) {
      out << (first ? "" : ", ") << "\"" << k << "\": " << us;
      first = false;
    }
    out << "}}\n";
  }
  return 0;
}
