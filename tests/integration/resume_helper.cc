// Test helper for resume_test: a Fabric program that trains a small conv net (BatchNorm, Dropout)
// on 40 synthetic images with shuffling and a random-flip augmentation, AdamW + cosine schedule,
// for trainer.max_steps steps, with the checkpoint: section in charge (Checkpointer).
// Extra keys:
//   test.width         8    channels
//   test.stop_at_step  -1   return right after this step (its checkpoint, if due, written)
//   test.out           ""   at the end, Fabric::save the whole state here (for comparison)
//   test.extra_params  0    size of an extra parameter vector (the crash test makes checkpoints
//                           tens of MB so that most of a run is spent saving)
//   test.extra_units   0    split the extra parameters over this many submodules of type Table
//                           (fsdp units by fabric.fsdp.wrap_modules=Table); 0: one vector
//                           in the net itself
//   test.cross_units   false  also one operator that takes a piece of every Table at once (fsdp
//                           gathers every unit for it)
//   test.clip_norm     0    Fabric::clip_gradients to this total norm before each step; 0: off
//   test.accumulate    1    micro-batches per step (each batch split; Fabric::backward(loss,
//                           MicroBatch): all but the last backward without gradient sync)
//   test.unsynced      none   all: every micro-batch's backward (Fabric::backward(loss / n))
//                           inside Fabric::no_backward_sync (the clip or step synchronizes the
//                           gradients); last: only the last one inside it, the others synchronized
//   test.memory        false  before the last step, rank 0 prints for every rank R "rank R bytes
//                           parameters=P gradients=G optimizer=O": distinct storages of the
//                           parameters and of the optimizer's parameters, of their gradients, of
//                           the optimizer state; under fabric.strategy: fsdp also "rank R fsdp
//                           units=U peak_gathered=B full=F": the most bytes of whole units at any
//                           time so far and the bytes of all units whole
//   test.peaks         false  rank 0 prints "rank R setup_peak=B" after setup and "rank R peak=B"
//                           at the end: the most bytes of CPU tensors the rank held
//                           (fabric/accelerators/memory.h; counted from launch when
//                           fabric.tensor_memory_limit_gb is set)
// The model is built by Fabric::init_module (fabric.empty_init applies).
// trainer.stop_on_nonfinite applies (fabric::NonFiniteGuard): a diverged run prints the guard's
// message and exits 3 on rank 0, like the examples.
// At the end under fsdp, rank 0 prints "fsdp: N all-gathers (M started ahead of use), R
// reduce-scatters" (its own counts).
// Everything else is the training schema (fabric.*, checkpoint.*, data.*, ...).
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/optimizer.h>
#include <torch/utils.h>

#include "fabric/accelerators/memory.h"
#include "fabric/checkpointer.h"
#include "fabric/fabric.h"
#include "fabric/main.h"
#include "fabric/nn/batch_norm.h"
#include "fabric/nonfinite_guard.h"
#include "fabric/training/lr_scheduler.h"
#include "fabric/training/optimizers.h"
#include "fabric/training/state_bytes.h"
#include "strategies/fsdp.h"
#include "strategies/sharded_parameters.h"

namespace {

struct TableImpl : torch::nn::Module {
  explicit TableImpl(int64_t size) { values = register_parameter("values", torch::zeros({size})); }
  torch::Tensor forward() { return values.square().mean(); }  // saves only the parameter
  torch::Tensor values;
};
TORCH_MODULE(Table);

struct NetImpl : torch::nn::Module {
  NetImpl(int64_t width, int64_t extra, int64_t units, bool cross) : cross_units(cross) {
    if (extra > 0 && units == 0) table = register_parameter("table", torch::zeros({extra}));
    if (extra > 0 && units > 0) {
      tables = register_module("tables", torch::nn::ModuleList());
      for (int64_t k = 0; k < units; ++k) tables->push_back(Table(extra / units));
    }
    conv = register_module("conv",
                           torch::nn::Conv2d(torch::nn::Conv2dOptions(3, width, 3).bias(false)));
    bn = register_module("bn", fabric::nn::BatchNorm2d(width));
    drop = register_module("drop", torch::nn::Dropout(0.3));
    fc = register_module("fc", torch::nn::Linear(width * 6 * 6, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(bn->forward(conv->forward(x)));
    auto out = fc->forward(drop->forward(h.flatten(1)));
    std::vector<torch::Tensor> firsts;
    if (tables) {
      for (const auto& t : *tables) {
        out = out + t->as<TableImpl>()->forward();
        firsts.push_back(t->as<TableImpl>()->values.narrow(0, 0, 1));
      }
    }
    if (cross_units && !firsts.empty()) out = out + torch::stack(firsts).square().mean();
    return table.defined() ? out + (table - 1).square().mean() : out;
  }
  torch::Tensor table;
  torch::nn::ModuleList tables{nullptr};
  bool cross_units = false;
  torch::nn::Conv2d conv{nullptr};
  fabric::nn::BatchNorm2d bn{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);

void print_memory(fabric::Fabric& f, torch::nn::Module& model, const torch::optim::Optimizer& opt) {
  const fabric::StateBytes b = fabric::state_bytes(model, opt);
  const auto all = f.all_gather(torch::tensor({b.parameters, b.gradients, b.optimizer}));
  for (size_t r = 0; r < all.size(); ++r)
    f.print("rank ", r, " bytes parameters=", all[r][0].item<int64_t>(),
            " gradients=", all[r][1].item<int64_t>(), " optimizer=", all[r][2].item<int64_t>());
  if (auto* fsdp = dynamic_cast<fabric::strategies::Fsdp*>(&f.strategy())) {
    const auto* sharded = fsdp->sharded();
    int64_t full = 0;
    for (const auto& u : sharded->units()) full += u.gathered_elements * 4;
    const auto stats = f.all_gather(torch::tensor(
        {static_cast<int64_t>(sharded->units().size()), sharded->peak_gathered_bytes(), full}));
    for (size_t r = 0; r < stats.size(); ++r)
      f.print("rank ", r, " fsdp units=", stats[r][0].item<int64_t>(),
              " peak_gathered=", stats[r][1].item<int64_t>(),
              " full=", stats[r][2].item<int64_t>());
  }
}

// Every rank's most bytes of CPU tensors so far, as rank 0 prints them: "rank R LABEL=B".
void print_peak(fabric::Fabric& f, const char* label) {
  const auto peak = f.all_gather(torch::tensor({fabric::memory_stats(torch::kCPU).peak}));
  for (size_t r = 0; r < peak.size(); ++r)
    f.print("rank ", r, " ", label, "=", peak[r][0].item<int64_t>());
}

fabric::Batch random_flip(fabric::Batch batch, at::Generator& gen) {
  auto flip = torch::rand({batch.data.size(0)}, gen) < 0.5;
  batch.data = torch::where(flip.view({-1, 1, 1, 1}), batch.data.flip(3), batch.data);
  return batch;
}

}  // namespace

int main(int argc, char** argv) {
  fabric::ConfigSchema schema = fabric::training_schema();
  schema.add("test.stop_at_step", fabric::KeySpec::integer(-1).min(-1));
  schema.add("test.out", fabric::KeySpec::string(""));
  schema.add("test.width", fabric::KeySpec::integer(8).min(1));
  schema.add("test.extra_params", fabric::KeySpec::integer(0).min(0));
  schema.add("test.extra_units", fabric::KeySpec::integer(0).min(0));
  schema.add("test.cross_units", fabric::KeySpec::boolean(false));
  schema.add("test.clip_norm", fabric::KeySpec::real(0.0).min(0));
  schema.add("test.accumulate", fabric::KeySpec::integer(1).min(1));
  schema.add("test.unsynced", fabric::KeySpec::choice({"none", "all", "last"}, "none"));
  schema.add("test.memory", fabric::KeySpec::boolean(false));
  schema.add("test.peaks", fabric::KeySpec::boolean(false));
  return fabric::run_main(argc, argv, schema, [](const fabric::Config& c) {
    fabric::Fabric fabric(c);
    return fabric.launch([&](fabric::Fabric& f) {
      Net model = f.init_module([&] {
        return Net(c.get_int("test.width"), c.get_int("test.extra_params"),
                   c.get_int("test.extra_units"), c.get_bool("test.cross_units"));
      });
      auto optimizer = fabric::make_optimizer(c, model->parameters());
      f.setup(model, *optimizer);
      // Tensor memory: the most during construction and setup.
      if (c.get_bool("test.peaks")) print_peak(f, "setup_peak");
      torch::manual_seed(123);  // the data is the same in every run and on every rank
      auto data = std::make_shared<fabric::TensorDataset>(torch::randn({40, 3, 8, 8}),
                                                          torch::randint(0, 5, {40}));
      f.seed_everything(c.get_int("fabric.seed"));
      auto train = f.setup_dataloader(data, fabric::DataLoaderOptions()
                                                .batch_size(c.get_int("data.batch_size"))
                                                .shuffle(true)
                                                .num_workers(c.get_int("data.num_workers"))
                                                .transform(random_flip));
      const int64_t total = c.get_int("trainer.max_steps");
      fabric::LRScheduler scheduler(*optimizer, fabric::LRSchedule::from_config(c, total));
      fabric::CheckpointState state;
      state.add("model", model).add("optimizer", *optimizer).add("scheduler", scheduler);
      state.add("train_loader", train);
      const double clip_norm = c.get_double("test.clip_norm");
      const int64_t accumulate = c.get_int("test.accumulate");
      const auto run = f.create_run_directory("resume_helper");
      fabric::Checkpointer checkpoints(f, state, "resume_helper", run.path());
      const int64_t stop_at = c.get_int("test.stop_at_step");
      fabric::NonFiniteGuard nonfinite(f);
      while (checkpoints.step() < total) {
        for (fabric::Batch& batch : train) {
          optimizer->zero_grad();
          torch::Tensor step_loss;
          const auto data = batch.data.chunk(accumulate), target = batch.target.chunk(accumulate);
          for (size_t m = 0; m < data.size(); ++m) {
            torch::Tensor loss;
            {
              auto guard = f.autocast();
              loss = torch::cross_entropy_loss(model->forward(data[m]), target[m]);
            }
            step_loss = loss.detach();
            const std::string unsynced = c.get_string("test.unsynced");
            if (unsynced == "none") {
              f.backward(loss, fabric::MicroBatch{static_cast<int64_t>(m),
                                                  static_cast<int64_t>(data.size())});
            } else {
              const fabric::ScopeGuard guard = unsynced == "all" || m + 1 == data.size()
                                                   ? f.no_backward_sync(model)
                                                   : fabric::ScopeGuard();
              f.backward(loss / static_cast<double>(data.size()));
            }
          }
          if (clip_norm > 0) f.clip_gradients(model, *optimizer, clip_norm);
          if (c.get_bool("test.memory") && checkpoints.step() + 1 == total)
            print_memory(f, *model, *optimizer);
          f.step(*optimizer);
          scheduler.step();
          checkpoints.step_end();
          if (nonfinite.update(step_loss, checkpoints.step())) {
            f.print("stopped: ", nonfinite.message());
            return f.is_global_zero() ? 3 : 0;
          }
          if (checkpoints.step() == stop_at) return 0;
          // Stop before taking another batch: the loader's position stays that of the last step.
          if (checkpoints.step() >= total) break;
        }
        checkpoints.epoch_end();
      }
      checkpoints.finish();
      if (!c.get_string("test.out").empty()) f.save(c.get_string("test.out"), state);
      if (auto* fsdp = dynamic_cast<fabric::strategies::Fsdp*>(&f.strategy()))
        f.print("fsdp: ", fsdp->sharded()->gathers(), " all-gathers (",
                fsdp->sharded()->prefetches(), " started ahead of use), ",
                fsdp->sharded()->reduce_scatters(), " reduce-scatters");
      if (c.get_bool("test.peaks")) print_peak(f, "peak");  // and the most in all
      f.print("done at step ", checkpoints.step(), " epoch ", checkpoints.epoch());
      return 0;
    });
  });
}
