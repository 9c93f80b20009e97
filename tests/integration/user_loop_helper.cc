// Test helper for user_loop_test: a minimal user training loop, written the way a user ports their
// own program (its own model class, its own loop, SGD built by hand, nothing of examples/): it
// reads no key of the training schema itself. So every trainer.*, data.* or model.* key a test
// sets is either applied by Fabric (model.init_weights in setup, trainer.gradient_clip_val in
// step) or named by the report of unread keys (fabric.strict_keys).
// Extra keys:
//   test.steps         12     optimizer steps
//   test.eval_every    3      evaluate every this many steps, then log "val/loss"
//   test.eval_limit    2      batches per evaluation (-1: the whole validation set)
//   test.own_eval      false  evaluate with the loop's own code (a range-for with a break)
//                             instead of Fabric::evaluate
//   test.end_pass      true   test.own_eval: call DataLoader::end_pass() after the break
//   test.save_init     ""     write the weights right after setup here (save_weights), go on
//   test.kill_at_step  -1     SIGKILL this process right after this step's checkpoint
//   test.fail          none   forward | backward: at step 3, a LibTorch error there (a view of a
//                             non-contiguous tensor; the backward of a loss without gradient);
//                             load: at step 3, load_weights from a file that does not exist;
//                             unused: from step 3 on, fc1 outside the loss (ddp's Reducer then
//                             fails at the next backward)
// Prints, on rank 0: "init SUM" after setup (the sum of every parameter, %.17g), "step S grad
// NORM MAX" after each f.step (the total norm and largest magnitude of the gradients the optimizer
// used), "val step S loss L examples N" after each evaluation.
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <csignal>
#include <cstdio>
#include <map>
#include <string>

#include "fabric/checkpointer.h"
#include "fabric/fabric.h"
#include "fabric/main.h"

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

std::string g17(double v) {
  char text[40];
  std::snprintf(text, sizeof(text), "%.17g", v);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  fabric::ConfigSchema schema = fabric::training_schema();
  schema.add("test.steps", fabric::KeySpec::integer(12).min(1));
  schema.add("test.eval_every", fabric::KeySpec::integer(3).min(1));
  schema.add("test.eval_limit", fabric::KeySpec::integer(2).min(-1));
  schema.add("test.own_eval", fabric::KeySpec::boolean(false));
  schema.add("test.end_pass", fabric::KeySpec::boolean(true));
  schema.add("test.save_init", fabric::KeySpec::string(""));
  schema.add("test.kill_at_step", fabric::KeySpec::integer(-1).min(-1));
  schema.add("test.fail",
             fabric::KeySpec::choice({"none", "forward", "backward", "load", "unused"}, "none"));
  return fabric::run_main(argc, argv, schema, [](const fabric::Config& c) {
    fabric::Fabric fabric(c);
    return fabric.launch([&](fabric::Fabric& f) {
      torch::manual_seed(5);  // the same data in every run and on every rank
      const torch::Tensor x = torch::randn({96, 6}), vx = torch::randn({40, 6});
      const torch::Tensor y = torch::randint(0, 3, {96}), vy = torch::randint(0, 3, {40});
      f.seed_everything(c.get_int("fabric.seed"));
      Mlp model;
      torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.5));
      f.setup(model, optimizer);
      double sum = 0;
      for (const auto& p : model->parameters()) sum += p.sum().item<double>();
      f.print("init ", g17(sum));
      if (!c.get_string("test.save_init").empty())
        f.save_weights(model, c.get_string("test.save_init"));
      auto train = f.setup_dataloader(fabric::TensorDataset(x, y),
                                      fabric::DataLoaderOptions().batch_size(8).shuffle(true));
      auto val = f.setup_dataloader(fabric::TensorDataset(vx, vy),
                                    fabric::DataLoaderOptions().batch_size(4).shuffle(true));
      fabric::CheckpointState state;
      state.add("model", model).add("optimizer", optimizer);
      state.add("train_loader", train).add("val_loader", val);
      fabric::Checkpointer checkpoints(f, state);
      const int64_t steps = c.get_int("test.steps"), every = c.get_int("test.eval_every");
      const int64_t limit = c.get_int("test.eval_limit");
      auto per_example = [&](const fabric::Batch& b) -> std::map<std::string, torch::Tensor> {
        return {{"loss", torch::cross_entropy_loss(model->forward(b.data), b.target, {},
                                                   at::Reduction::None)}};
      };
      auto evaluate = [&]() -> std::map<std::string, double> {
        if (!c.get_bool("test.own_eval")) return f.evaluate(val, per_example, limit);
        torch::NoGradGuard no_grad;
        double total = 0;
        int64_t n = 0, b = 0;
        for (fabric::Batch& batch : val) {
          if (limit >= 0 && b++ >= limit) break;
          total += per_example(batch).at("loss").sum().item<double>();
          n += batch.size();
        }
        if (c.get_bool("test.end_pass")) val.end_pass();
        return {{"loss", total / static_cast<double>(n)}, {"examples", static_cast<double>(n)}};
      };
      while (checkpoints.step() < steps) {
        for (fabric::Batch& batch : train) {
          optimizer.zero_grad();
          const std::string fail = checkpoints.step() == 2 ? c.get_string("test.fail") : "none";
          if (fail == "load") f.load_weights(model, "no_such_weights.safetensors");
          torch::Tensor logits = c.get_string("test.fail") == "unused" && checkpoints.step() >= 2
                                     ? model->fc2(torch::tanh(model->fc1(batch.data).detach()))
                                     : model->forward(batch.data);
          if (fail == "forward") logits = logits.t().view({-1});
          torch::Tensor loss = torch::cross_entropy_loss(logits, batch.target);
          f.backward(fail == "backward" ? loss.detach() : loss);
          f.step(optimizer);
          double norm = 0, largest = 0;
          for (const auto& p : model->parameters()) {
            if (!p.grad().defined()) continue;  // test.fail=unused
            norm += p.grad().square().sum().item<double>();
            largest = std::max(largest, p.grad().abs().max().item<double>());
          }
          const int64_t step = checkpoints.step() + 1;
          f.print("step ", step, " grad ", g17(std::sqrt(norm)), " ", g17(largest));
          if (step % every == 0) {
            const auto means = evaluate();
            f.print("val step ", step, " loss ", g17(means.at("loss")), " examples ",
                    means.at("examples"));
          }
          checkpoints.step_end();
          if (step == c.get_int("test.kill_at_step")) std::raise(SIGKILL);
          if (checkpoints.step() >= steps) break;
        }
        checkpoints.epoch_end();
      }
      checkpoints.finish();
      return 0;
    });
  });
}
