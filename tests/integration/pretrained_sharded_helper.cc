// pretrained_sharded_test's program: a Hugging Face Llama folder (make_llamas.py) loaded through
// Fabric::load_weights(module, tensors, source) into a fabric::models::Llama built by an empty
// init and set up under the strategy the config names, then one SGD step. Global rank 0 prints
//   loaded_exact=0|1   the loaded weights (gathered: save_weights) equal the folder's bitwise
//   logits=R           max |logits - transformers'| / max |transformers'| (gathered over tp)
//   stepped=R          the same for the weights after one step against ref - lr * grad
//   rank R load_extra_bytes=B ...  tensor memory the load allocated beyond the model's, and the
//                      peak resident memory (VmHWM) after the load and at the end
// test.before_setup: loaded before setup instead (with test.empty_init=false: a whole model);
// test.cut=NAME: tensor NAME given a row short (the load's error ends the program).
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "fabric/accelerators/memory.h"
#include "fabric/checkpoint/safetensors.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/fabric.h"
#include "fabric/hf/llama.h"
#include "fabric/hf/weights.h"
#include "fabric/main.h"
#include "fabric/models/llama.h"

namespace fs = std::filesystem;

namespace {

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

std::string vmhwm_kb() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::to_string(std::stoll(line.substr(6)));
  return "-1";
}

std::map<std::string, torch::Tensor> by_name(const fabric::StateDict& tensors) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [n, t] : tensors) out[n] = t;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  fabric::ConfigSchema schema = fabric::training_schema();
  schema.add("test.folder", fabric::KeySpec::string(""));
  schema.add("test.reference", fabric::KeySpec::string(""));
  schema.add("test.out", fabric::KeySpec::string(""));
  schema.add("test.lr", fabric::KeySpec::real(0.1));
  schema.add("test.before_setup", fabric::KeySpec::boolean(false));
  schema.add("test.cut", fabric::KeySpec::string(""));
  schema.add("test.empty_init", fabric::KeySpec::boolean(true));
  return fabric::run_main(argc, argv, schema, [](const fabric::Config& c) {
    fabric::Fabric fabric(c);
    return fabric.launch([&](fabric::Fabric& f) {
      const fs::path folder = c.get_string("test.folder");
      const fs::path out = c.get_string("test.out");
      const double lr = c.get_double("test.lr");
      const bool before = c.get_bool("test.before_setup");
      fabric::memory_stats(torch::Device(torch::kCPU));  // counts tensors from here on
      const fabric::models::LlamaConfig config = fabric::hf::read_llama_config(folder);
      auto model = f.init_module([&] { return fabric::models::Llama(config); },
                                 c.get_bool("test.empty_init"));
      torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(lr));
      const fabric::hf::Weights weights = fabric::hf::read_weights(folder);
      // Checked against the model's whole shapes while it has them (its meta tensors' before
      // setup); test.cut: one tensor given a row short, unchecked, for Fabric's error.
      fabric::StateDict tensors = weights.tensors;
      const std::string cut = c.get_string("test.cut");
      if (cut.empty()) {
        tensors = fabric::hf::checked_weights(*model, weights, folder);
      } else {
        for (auto& [name, t] : tensors)
          if (name == cut) t = t.narrow(0, 0, t.size(0) - 1);
      }
      if (before) f.load_weights(model, tensors, folder.string());
      f.setup(model, optimizer);
      // Tensor memory the load allocates beyond what the model holds: none (no unit gathered,
      // no copy of a slice or of the model kept).
      const torch::Device cpu(torch::kCPU);
      const int64_t held = fabric::memory_stats(cpu).allocated;
      fabric::reset_peak_memory(cpu);
      if (!before) f.load_weights(model, tensors, folder.string());
      const int64_t load_extra = fabric::memory_stats(cpu).peak - held;
      const std::string after_load = vmhwm_kb();

      const auto file = by_name(weights.tensors);
      const auto ref = by_name(fabric::load_safetensors(c.get_string("test.reference")).tensors);
      const fs::path loaded = out / ("loaded" + std::to_string(f.world_size()) + ".safetensors");
      f.save_weights(model, loaded.string());
      if (f.is_global_zero()) {
        bool exact = true;
        for (const auto& [name, t] : fabric::load_safetensors(loaded).tensors)
          exact = exact && torch::equal(t, file.at(name).to(t.scalar_type()));
        f.print("loaded_exact=", exact ? 1 : 0);
      }

      const torch::Tensor ids = ref.at("ids");
      torch::Tensor logits;
      {
        torch::NoGradGuard no_grad;
        logits = model->forward(ids);
      }
      const int64_t vocab = ref.at("logits").size(-1);
      if (logits.size(-1) != vocab) logits = torch::cat(f.all_gather(logits.contiguous()), -1);
      if (f.is_global_zero()) f.print("logits=", relative(logits, ref.at("logits")));

      const int64_t T = ids.size(1);
      optimizer.zero_grad();
      const torch::Tensor loss = model->loss(ids.narrow(1, 0, T - 1), ids.narrow(1, 1, T - 1));
      f.backward(loss);
      f.step(optimizer);
      const fs::path stepped = out / ("stepped" + std::to_string(f.world_size()) + ".safetensors");
      f.save_weights(model, stepped.string());
      if (f.is_global_zero()) {
        double worst = 0;
        for (const auto& [name, t] : fabric::load_safetensors(stepped).tensors) {
          const torch::Tensor expected =
              file.at(name).to(torch::kFloat) - lr * ref.at("grad." + name);
          worst = std::max(worst, relative(t.to(torch::kFloat), expected));
        }
        f.print("stepped=", worst);
      }
      const std::string hwm = vmhwm_kb();
      for (int64_t r = 0; r < f.world_size(); ++r) {
        if (r == f.global_rank())
          std::cout << "rank " << r << " load_extra_bytes=" << load_extra
                    << " after_load_vmhwm_kb=" << after_load << " vmhwm_kb=" << hwm << std::endl;
        f.barrier();
      }
      return 0;
    });
  });
}
