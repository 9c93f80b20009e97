// Test helper for multi_module_test: user loops that set up more than one module, as Lightning
// Fabric's users do (each f.setup on its own), run unchanged on one process and under ddp.
// Extra keys:
//   test.mode   gan      gan: a generator and a discriminator, each with its own SGD; the
//                        discriminator's step trains on a detached fake (its backward reaches only
//                        it), the generator's loss goes through both;
//                        distill: a student trained towards a frozen teacher set up beside it;
//                        partial: a second module whose loss uses one of its two heads;
//                        sometimes: a second module only rank 1's loss reaches (find_unused);
//                        unfreeze: distill, with the teacher unfrozen after setup;
//                        shared: a module, then one of its layers, each set up
//   test.steps  6        steps (gan: one discriminator and one generator step each)
// The data: 8 examples a step, the same on every process; rank r of W takes rows [r*8/W,
// (r+1)*8/W), so the mean gradient over the ranks is the one process's over all 8. Prints, on
// rank 0, after the last step: "param MODULE.NAME v1 v2 ..." for every parameter (%.9g).
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cstdio>
#include <string>

#include "fabric/fabric.h"
#include "fabric/main.h"

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden, int64_t out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

// Two heads over one trunk; test.mode=partial's loss reads only `a`.
struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl() {
    trunk = register_module("trunk", torch::nn::Linear(6, 8));
    a = register_module("a", torch::nn::Linear(8, 1));
    b = register_module("b", torch::nn::Linear(8, 1));
  }
  torch::nn::Linear trunk{nullptr}, a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoHeads);

void print_params(fabric::Fabric& f, const std::string& module, torch::nn::Module& m) {
  for (const auto& item : m.named_parameters()) {
    const torch::Tensor v = item.value().detach().flatten().to(torch::kDouble);
    std::string line = "param " + module + "." + item.key();
    for (int64_t i = 0; i < v.numel(); ++i) {
      char text[32];
      std::snprintf(text, sizeof(text), " %.9g", v[i].item<double>());
      line += text;
    }
    f.print(line);
  }
}

}  // namespace

int main(int argc, char** argv) {
  fabric::ConfigSchema schema = fabric::training_schema();
  schema.add("test.mode",
             fabric::KeySpec::choice(
                 {"gan", "distill", "partial", "sometimes", "unfreeze", "shared"}, "gan"));
  schema.add("test.steps", fabric::KeySpec::integer(6).min(0));
  return fabric::run_main(argc, argv, schema, [](const fabric::Config& c) {
    fabric::Fabric fabric(c);
    return fabric.launch([&](fabric::Fabric& f) {
      const int64_t steps = c.get_int("test.steps");
      torch::manual_seed(11);  // the same data on every process
      const torch::Tensor real = torch::randn({steps * 8, 6}) * 0.5 + 1.0;
      const torch::Tensor noise = torch::randn({steps * 8, 4});
      const int64_t per = 8 / f.world_size(), first = f.global_rank() * per;
      auto rows = [&](const torch::Tensor& t, int64_t step) {
        return t.slice(0, step * 8 + first, step * 8 + first + per);
      };
      f.seed_everything(c.get_int("fabric.seed"));
      const std::string mode = c.get_string("test.mode");
      if (mode == "gan") {
        Mlp generator(4, 8, 6), discriminator(6, 8, 1);
        torch::optim::SGD opt_g(generator->parameters(), torch::optim::SGDOptions(0.2));
        torch::optim::SGD opt_d(discriminator->parameters(), torch::optim::SGDOptions(0.2));
        f.setup(generator, opt_g);
        f.setup(discriminator, opt_d);
        for (int64_t step = 0; step < steps; ++step) {
          const torch::Tensor fake = generator->forward(f.to_device(rows(noise, step)));
          const torch::Tensor x = f.to_device(rows(real, step));
          const torch::Tensor ones = torch::ones({per, 1}, x.options());
          opt_d.zero_grad();
          const torch::Tensor d_loss =
              torch::binary_cross_entropy_with_logits(discriminator->forward(x), ones) +
              torch::binary_cross_entropy_with_logits(discriminator->forward(fake.detach()),
                                                      torch::zeros_like(ones));
          f.backward(d_loss);  // reaches the discriminator only
          f.step(opt_d);
          opt_g.zero_grad();
          f.backward(torch::binary_cross_entropy_with_logits(discriminator->forward(fake), ones));
          f.step(opt_g);
        }
        print_params(f, "generator", *generator);
        print_params(f, "discriminator", *discriminator);
      } else if (mode == "sometimes") {
        Mlp main_module(6, 8, 1), aux(6, 4, 1);
        std::vector<torch::Tensor> all = main_module->parameters();
        for (const auto& p : aux->parameters()) all.push_back(p);
        torch::optim::SGD opt(all, torch::optim::SGDOptions(0.1));
        f.setup(main_module);
        f.setup(aux, opt);
        for (int64_t step = 0; step < steps; ++step) {
          const torch::Tensor x = f.to_device(rows(real, step));
          opt.zero_grad();
          torch::Tensor loss = main_module->forward(x).square().mean();
          if (f.global_rank() == 1) loss = loss + aux->forward(x).square().mean();
          f.backward(loss);
          f.step(opt);
        }
        print_params(f, "main", *main_module);
      } else if (mode == "shared") {
        Mlp whole(6, 8, 1);
        f.setup(whole);
        f.setup(whole->fc1);
      } else if (mode == "distill" || mode == "unfreeze") {
        Mlp teacher(6, 16, 3), student(6, 4, 3);
        for (auto& p : teacher->parameters()) p.requires_grad_(false);
        torch::optim::SGD opt(student->parameters(), torch::optim::SGDOptions(0.3));
        f.setup(teacher);
        f.setup(student, opt);
        if (mode == "unfreeze")
          for (auto& p : teacher->parameters()) p.requires_grad_(true);
        for (int64_t step = 0; step < steps; ++step) {
          const torch::Tensor x = f.to_device(rows(real, step));
          opt.zero_grad();
          f.backward(torch::mse_loss(student->forward(x), teacher->forward(x)));
          f.step(opt);
        }
        print_params(f, "student", *student);
        print_params(f, "teacher", *teacher);
      } else {
        Mlp first_module(6, 8, 1);
        TwoHeads heads;
        std::vector<torch::Tensor> all = first_module->parameters();
        for (const auto& p : heads->parameters()) all.push_back(p);
        torch::optim::SGD opt(all, torch::optim::SGDOptions(0.1));
        f.setup(first_module);
        f.setup(heads, opt);
        for (int64_t step = 0; step < steps; ++step) {
          const torch::Tensor x = f.to_device(rows(real, step));
          opt.zero_grad();
          const torch::Tensor h = torch::relu(heads->trunk(x));
          f.backward((heads->a(h) - first_module->forward(x)).square().mean());
          f.step(opt);
        }
        print_params(f, "first", *first_module);
        print_params(f, "heads", *heads);
      }
      return 0;
    });
  });
}
