// lora_test's multi-process program: make_lora.py's tiny Llama (test.folder/base) with peft's
// adapter (test.folder/adapter) set up under the strategy the config names, then one SGD step
// (lr 0.1) of the optimizer over the adapters on the reference ids: one process takes both rows,
// each of 2 ranks (ddp or fsdp) one. Every rank prints "rank R base_grads=N base_changed=M
// base_held=H of T" (base parameters with a gradient, and changed by the step: 0 and 0 when only
// the adapters are in the reducer and the optimizer; the base's elements this rank keeps between
// operators, of its T: fsdp shards the frozen base too); global rank 0 writes the adapters after
// the step to test.out/adapters<world>.safetensors and prints "loss=L" (the mean over the ranks).
#include <torch/optim/sgd.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "fabric/checkpoint/safetensors.h"
#include "fabric/fabric.h"
#include "fabric/hf/llama.h"
#include "fabric/main.h"
#include "fabric/models/llama.h"
#include "fabric/nn/lora.h"
#include "strategies/fsdp.h"
#include "strategies/sharded_parameters.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  fabric::ConfigSchema schema = fabric::training_schema();
  schema.add("test.folder", fabric::KeySpec::string(""));
  schema.add("test.out", fabric::KeySpec::string(""));
  schema.add("test.base_dtype", fabric::KeySpec::string("auto"));  // store_lora_base's
  return fabric::run_main(argc, argv, schema, [](const fabric::Config& c) {
    fabric::Fabric fabric(c);
    return fabric.launch([&](fabric::Fabric& f) {
      const fs::path folder = c.get_string("test.folder");
      fabric::models::Llama model = fabric::hf::load_llama(folder / "base");
      fabric::nn::LoraOptions lora;
      lora.rank = 4;
      lora.alpha = 8;
      lora.target_modules = {"q_proj", "v_proj", "down_proj"};
      fabric::nn::apply_lora(*model, lora);
      fabric::nn::load_lora_state(*model, fabric::nn::read_lora_state(folder / "adapter"));
      fabric::nn::store_lora_base(
          *model, fabric::nn::parse_lora_base_dtype(c.get_string("test.base_dtype")));
      std::map<std::string, torch::Tensor> before;
      std::vector<torch::Tensor> trainable;
      for (const auto& item : model->named_parameters()) {
        before[item.key()] = item.value().detach().clone();
        if (item.value().requires_grad()) trainable.push_back(item.value());
      }
      torch::optim::SGD optimizer(trainable, torch::optim::SGDOptions(0.1));
      f.setup(model, optimizer);
      int64_t base_total = 0;
      for (const auto& p : model->parameters())
        if (!p.requires_grad()) base_total += p.numel();
      int64_t base_held = base_total;
      if (auto* fsdp = dynamic_cast<fabric::strategies::Fsdp*>(&f.strategy()))
        for (const auto& u : fsdp->sharded()->units())
          if (u.frozen) base_held += u.gathered_elements / f.world_size() - u.elements;

      torch::Tensor ids;
      for (auto& [n, t] : fabric::load_safetensors(folder / "ref.safetensors").tensors)
        if (n == "ids") ids = t;
      const int64_t world = f.world_size(), rank = f.global_rank();
      const int64_t rows = ids.size(0) / world, T = ids.size(1);
      ids = ids.narrow(0, rank * rows, rows);
      optimizer.zero_grad();
      torch::Tensor loss = model->loss(ids.narrow(1, 0, T - 1), ids.narrow(1, 1, T - 1));
      f.backward(loss);
      f.step(optimizer);

      int base_grads = 0, base_changed = 0;
      for (const auto& item : model->named_parameters()) {
        if (item.key().find(".lora_") != std::string::npos) continue;
        base_grads += item.value().grad().defined() ? 1 : 0;
        base_changed += torch::equal(item.value().detach(), before.at(item.key())) ? 0 : 1;
      }
      for (int64_t r = 0; r < world; ++r) {
        if (r == rank)
          std::cout << "rank " << r << " base_grads=" << base_grads
                    << " base_changed=" << base_changed << " base_held=" << base_held << " of "
                    << base_total << std::endl;
        f.barrier();
      }
      const torch::Tensor mean = f.all_reduce(loss.detach());
      // On every rank: under fsdp reading a unit's parameter gathers it (collective).
      std::vector<std::pair<std::string, at::Tensor>> tensors;
      for (const auto& [n, t] : fabric::nn::lora_state(*model)) tensors.emplace_back(n, t.clone());
      if (f.is_global_zero()) {
        const fs::path out = fs::path(c.get_string("test.out")) /
                             ("adapters" + std::to_string(world) + ".safetensors");
        fabric::save_safetensors(out, tensors);
        std::cout << "loss=" << mean.item<double>() << std::endl;
      }
      return 0;
    });
  });
}
