// Test helper for param_groups_test: a Fabric program (ranks self-launched) that trains an MLP
// (Linear, LayerNorm, Tanh, Linear) for test.steps steps with fabric::make_optimizer(config,
// *model) and the config's LR schedule, each rank on its slice of the global batch, then on rank 0
// compares the parameters with one process taking the same steps with plain LibTorch
// (implementation for_loop) on the whole global batch, its groups written out by hand for the rules
//   optimizer.no_weight_decay=["*.bias", "type:LayerNorm"]  optimizer.lr_scale=["3.*=5"]
// (which the test passes; the helper refuses other rules): every bias and the LayerNorm without
// weight decay, the last Linear at 5x the scheduled rate.
// Prints (rank 0) "groups=G max_rel_diff=X ungrouped_rel_diff=Y" and exits 0 when X is within
// 1e-6 and Y (the same training with one plain group) is above 1e-3, so the rules mattered.
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdio>

#include "fabric/fabric.h"
#include "fabric/main.h"
#include "fabric/training/lr_scheduler.h"
#include "fabric/training/optimizers.h"

namespace {

torch::nn::Sequential make_model() {
  torch::manual_seed(1234);
  return torch::nn::Sequential(torch::nn::Linear(8, 16),
                               torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})),
                               torch::nn::Tanh(), torch::nn::Linear(16, 4));
}

std::pair<torch::Tensor, torch::Tensor> global_batch(int64_t step, int64_t n) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + step));
  return {torch::randn({n, 8}, gen), torch::randn({n, 4}, gen)};
}

// The reference optimizer: one group per parameter with the rate scale and weight decay the rules
// give it (grouped = true), or one group of everything (grouped = false).
struct Reference {
  torch::nn::Sequential model = make_model();
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<double> scales;

  Reference(const fabric::Config& c, bool grouped) {
    // 0.weight 0.bias 1.weight 1.bias 3.weight 3.bias
    const std::vector<double> scale = {1, 1, 1, 1, 5, 5};
    const std::vector<bool> decay = {true, false, false, false, true, false};
    const double lr = c.get_double("optimizer.lr"), wd = c.get_double("optimizer.weight_decay");
    const bool sgd = c.get_string("optimizer.name") == "sgd";
    auto options = [&](size_t i) -> std::unique_ptr<torch::optim::OptimizerOptions> {
      const double w = !grouped || decay[i] ? wd : 0.0;
      const double r = lr * (grouped ? scale[i] : 1.0);
      if (sgd)
        return std::make_unique<torch::optim::SGDOptions>(
            torch::optim::SGDOptions(r)
                .momentum(c.get_double("optimizer.momentum"))
                .weight_decay(w));
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(r).weight_decay(w));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    const auto params = model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      groups.emplace_back(std::vector<torch::Tensor>{params[i]}, options(i));
      scales.push_back(grouped ? scale[i] : 1.0);
    }
    if (sgd) {
      optimizer = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(lr));
    } else {
      optimizer = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(lr));
    }
  }

  void train(const fabric::LRSchedule& schedule, int64_t steps, int64_t n) {
    for (int64_t s = 0; s < steps; ++s) {
      auto& groups = optimizer->param_groups();
      for (size_t g = 0; g < groups.size(); ++g)
        groups[g].options().set_lr(schedule.lr_at(s) * scales[g]);
      auto [x, y] = global_batch(s, n);
      optimizer->zero_grad();
      torch::mse_loss(model->forward(x), y).backward();
      optimizer->step();
    }
  }
};

double max_rel_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < b.size(); ++i)
    worst = std::max(
        worst,
        ((a[i].cpu() - b[i]).abs().max() / b[i].abs().max().clamp_min(1e-12)).item<double>());
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  fabric::ConfigSchema schema = fabric::training_schema();
  schema.add("test.batch", fabric::KeySpec::integer(6).min(1).doc("examples per rank and step"));
  schema.add("test.steps", fabric::KeySpec::integer(8).min(1));
  return fabric::run_main(argc, argv, schema, [](const fabric::Config& c) {
    const auto rules = fabric::param_group_rules(c);
    if (rules.no_weight_decay != std::vector<std::string>{"*.bias", "type:LayerNorm"} ||
        rules.lr_scale != std::vector<std::pair<std::string, double>>{{"3.*", 5.0}}) {
      std::fprintf(stderr, "param_groups_helper: pass the rules its reference is written for\n");
      return 2;
    }
    fabric::Fabric fabric(c);
    return fabric.launch([&](fabric::Fabric& f) -> int {
      const int64_t batch = c.get_int("test.batch"), steps = c.get_int("test.steps");
      const int64_t world = f.world_size(), rank = f.global_rank();
      auto model = make_model();
      auto optimizer = fabric::make_optimizer(c, *model);
      const size_t groups = optimizer->param_groups().size();
      f.setup(model, *optimizer);
      const auto schedule = fabric::LRSchedule::from_config(c, steps);
      fabric::LRScheduler scheduler(*optimizer, schedule);
      for (int64_t s = 0; s < steps; ++s) {
        auto [x, y] = global_batch(s, world * batch);
        optimizer->zero_grad();
        f.backward(torch::mse_loss(model->forward(x.narrow(0, rank * batch, batch)),
                                   y.narrow(0, rank * batch, batch)));
        f.step(*optimizer);
        scheduler.step();
      }
      std::vector<torch::Tensor> trained;
      {
        auto whole = f.strategy().materialize_parameters(*model, /*write_back=*/false);
        for (const auto& p : model->parameters()) trained.push_back(p.detach().clone());
      }
      if (rank != 0) return 0;
      Reference grouped(c, true), plain(c, false);
      grouped.train(schedule, steps, world * batch);
      plain.train(schedule, steps, world * batch);
      const double diff = max_rel_diff(trained, grouped.model->parameters());
      const double ungrouped = max_rel_diff(trained, plain.model->parameters());
      std::printf("groups=%zu max_rel_diff=%.3g ungrouped_rel_diff=%.3g\n", groups, diff,
                  ungrouped);
      std::fflush(stdout);
      return diff <= 1e-6 && ungrouped > 1e-3 ? 0 : 1;
    });
  });
}
