// bazel run //tools:estimate_memory -- --config=FILE [--program=auto|cifar10|fashion_mnist|gpt]
//                                      [--json] [key=value ...]
//
// What one process of an example program's training run holds, for each strategy at the
// config's world size: parameters, gradients, optimizer state, the strategy's own buffers (ddp's
// gradient buckets, fsdp's gathered units) and activations, in bytes (Accelerate's
// `accelerate estimate-memory`, which counts the parameters only). For gpt, model.pretrained=DIR
// estimates that Hugging Face folder's model (its config.json; the weights are not read).
//
// How. The model is built from the config as the program builds it, under an empty init (no
// memory; fabric/nn/empty_init.h): parameters in the precision's dtype (*-true converts them),
// the optimizer's state from its options (fabric::optimizer_state_bytes_expected), fsdp's units
// by the wrapping policy (ShardedParameters::plan_units). Activations are measured, not modelled:
// the model is materialised on the CPU and one forward and backward run at data.batch_size (at
// most 16) and at half of it with LibTorch's allocator counted (fabric/accelerators/memory.h);
// the difference gives one example's activations, scaled to data.batch_size; what does not grow
// with the batch beyond the gradients (the loss's outputs, workspaces) is added once. Under *-mixed
// the CPU's autocast runs (bf16; fp16 under 16-mixed), which is close to, not the same as, CUDA's.
// --activations=skip leaves them out (for a model too large to materialise here).
// Checked against runs: tests/integration/examples_tools_test.cc compares the totals with the
// peak tensor memory the runs record (summary.json's peak_tensor_bytes): within 20%.
//
// Exit status: 0 (also for --help); 2 for a bad config or argument, or sizes whose byte counts
// overflow 64 bits (one line naming it).
#include <torch/nn/module.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "examples/common/models.h"
#include "examples/common/recipes.h"
#include "examples/gpt_recipe.h"
#include "fabric/accelerators/memory.h"
#include "fabric/config/config.h"
#include "fabric/connector.h"
#include "fabric/core/error.h"
#include "fabric/models/llama.h"
#include "fabric/nn/empty_init.h"
#include "fabric/precision/autocast.h"
#include "fabric/precision/precision.h"
#include "fabric/training/optimizers.h"
#include "fabric/training/state_bytes.h"
#include "strategies/sharded_parameters.h"

namespace {

using fabric::Config;
using fabric::Error;

struct Model {
  std::string program, description;
  std::shared_ptr<torch::nn::Module> module;
  std::shared_ptr<fabric::InitRecord> record;
  // One training step's loss for a batch of `b` examples (the program's inputs, converted by
  // the precision, and its loss).
  std::function<torch::Tensor(int64_t b, const fabric::Precision&)> loss;
};

Model build(const std::string& program, const Config& c) {
  Model m;
  m.program = program;
  fabric::EmptyInit scope;
  if (program == "gpt" && !c.get_string("model.pretrained").empty()) {
    // A Hugging Face folder's model (config.json only; the weights are not read).
    const auto choice = examples::gpt::choose_model(c, 0);
    const int64_t window = choice.window, vocab = choice.vocab_size();
    m.description =
        choice.pretrained->describe() + ", " + std::to_string(window) + " tokens per sequence";
    if (choice.is_llama()) {
      fabric::models::Llama llama(*choice.pretrained->llama);
      m.module = llama.ptr();
      m.loss = [llama, window, vocab](int64_t b, const fabric::Precision&) mutable {
        const auto tokens = torch::randint(vocab, {b, window}, torch::kLong);
        return llama->loss(tokens, tokens);
      };
    } else {
      fabric::models::GPT gpt(choice.gpt);
      m.module = gpt.ptr();
      m.loss = [gpt, window, vocab](int64_t b, const fabric::Precision&) mutable {
        const auto tokens = torch::randint(vocab, {b, window}, torch::kLong);
        return gpt->loss(tokens, tokens);
      };
    }
  } else if (program == "gpt") {
    const auto mc = examples::gpt::model_config(c, 0);  // model.vocab_size, else the preset's
    fabric::models::GPT gpt(mc);
    m.module = gpt.ptr();
    m.description = "GPT(" + std::to_string(mc.n_layer) + " layers, " + std::to_string(mc.n_embd) +
                    " wide, vocabulary " + std::to_string(mc.vocab_size) + ", " +
                    std::to_string(mc.block_size) + " tokens per sequence)";
    m.loss = [gpt, mc](int64_t b, const fabric::Precision&) mutable {
      const auto tokens = torch::randint(mc.vocab_size, {b, mc.block_size}, torch::kLong);
      return gpt->loss(tokens, tokens);
    };
  } else if (program == "fashion_mnist") {
    examples::SmallCnn net(c.get_int("model.width"), c.get_int("model.hidden"));
    m.module = net.ptr();
    m.description = "SmallCnn(width " + std::to_string(c.get_int("model.width")) + ", hidden " +
                    std::to_string(c.get_int("model.hidden")) + ")";
    m.loss = [net](int64_t b, const fabric::Precision& p) mutable {
      return torch::cross_entropy_loss(net->forward(p.convert_input(torch::randn({b, 1, 28, 28}))),
                                       torch::randint(10, {b}, torch::kLong));
    };
  } else {
    examples::ResNet18Cifar net(c.get_int("model.width"));
    m.module = net.ptr();
    m.description = "ResNet18Cifar(width " + std::to_string(c.get_int("model.width")) + ")";
    m.loss = [net](int64_t b, const fabric::Precision& p) mutable {
      return torch::cross_entropy_loss(net->forward(p.convert_input(torch::randn({b, 3, 32, 32}))),
                                       torch::randint(10, {b}, torch::kLong));
    };
  }
  m.record = scope.record();
  return m;
}

// The config under the first program whose keys it has (a config of fabric.* keys only is
// cifar10's, the README's program).
std::pair<std::string, Config> load(const std::string& program, const std::string& file,
                                    const std::vector<std::string>& overrides) {
  const std::vector<std::pair<std::string, fabric::ConfigSchema (*)()>> programs = {
      {"cifar10", &examples::cifar10_schema},
      {"fashion_mnist", &examples::fashion_mnist_schema},
      {"gpt", &examples::gpt::schema}};
  std::string first_error, known_keys_error, known_keys_program;
  for (const auto& [name, schema] : programs) {
    if (program != "auto" && program != name) continue;
    try {
      return {name, Config::load(file, overrides, schema())};
    } catch (const fabric::ConfigError& e) {
      if (program != "auto") throw;
      const std::string what = e.what();
      if (first_error.empty()) first_error = what;
      // The program whose keys the config has (its error is a value's, not an unknown key's):
      // that error is the one to fix (data.batch_size=-5 in a gpt config, say).
      if (known_keys_error.empty() && what.find("unknown key") == std::string::npos) {
        known_keys_error = what;
        known_keys_program = name;
      }
    }
  }
  if (program != "auto")
    throw Error("--program=" + program + ": not one of auto, cifar10, fashion_mnist, gpt");
  if (!known_keys_error.empty())
    throw Error(known_keys_error + " (read as " + known_keys_program + "'s config)");
  throw Error(first_error + " (read as cifar10's config; --program=NAME names another)");
}

// Bytes that grow with the batch (per example) and the rest of a step's working memory beyond
// the gradients, measured on the CPU.
struct Activations {
  int64_t per_example = 0;
  int64_t fixed = 0;
};

Activations measure(Model& m, fabric::Precision& precision, int64_t gradient_bytes, int64_t batch) {
  fabric::materialize(*m.module, *m.record, torch::kCPU);
  precision.convert_module(*m.module);
  m.module->train();
  const c10::Device cpu(c10::kCPU);
  auto step = [&](int64_t b) {
    for (auto& p : m.module->parameters()) p.mutable_grad() = torch::Tensor();
    fabric::reset_peak_memory(cpu);
    const int64_t before = fabric::memory_stats(cpu).allocated;
    torch::Tensor loss;
    {
      const fabric::AutocastGuard autocast = precision.autocast();
      loss = m.loss(b, precision);
    }
    loss.backward();
    return fabric::memory_stats(cpu).peak - before;
  };
  // At the batch size (at most 16: beyond it linear) and half of it; a first step at 1 leaves
  // lazily made state (oneDNN's, the generator's) out of the measurement.
  const int64_t full = std::clamp<int64_t>(batch, 2, 16), half = full / 2;
  step(1);
  const int64_t at_half = step(half), at_full = step(full);
  Activations a;
  a.per_example = std::max<int64_t>(0, (at_full - at_half) / (full - half));
  a.fixed = std::max<int64_t>(0, at_full - a.per_example * full - gradient_bytes);
  for (auto& p : m.module->parameters()) p.mutable_grad() = torch::Tensor();
  return a;
}

// Byte counts in checked arithmetic: sizes whose product or sum passes 2^63 bytes (an absurd
// data.batch_size or model width) are refused, not printed as negative MiB.
[[noreturn]] void overflows(int64_t a, const char* op, int64_t b) {
  throw Error("estimate_memory: the estimate overflows 64-bit byte counts (" + std::to_string(a) +
              op + std::to_string(b) +
              "): the config's sizes (data.batch_size, the model's) are beyond any machine");
}
int64_t times(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) overflows(a, " x ", b);
  return out;
}
int64_t plus(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) overflows(a, " + ", b);
  return out;
}

std::string mib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", static_cast<double>(bytes) / (1 << 20));
  return text;
}

int run(int argc, char** argv) {
  std::string program = "auto", file;
  bool json = false, activations = true;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--config=", 0) == 0) {
      file = a.substr(9);
    } else if (a.rfind("--program=", 0) == 0) {
      program = a.substr(10);
    } else if (a == "--help" || a == "-h") {
      std::cout
          << "usage: estimate_memory --config=FILE [--program=auto|cifar10|fashion_mnist|gpt] "
             "[--json] [--activations=measure|skip] [key=value ...]\n";
      return 0;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--activations=skip") {
      activations = false;
    } else if (a == "--activations=measure") {
      activations = true;
    } else if (a.find('=') != std::string::npos && a.rfind("--", 0) != 0) {
      overrides.push_back(a);
    } else {
      throw Error("estimate_memory: unknown argument '" + a +
                  "' (--config=FILE, --program=auto|cifar10|fashion_mnist|gpt, --json, "
                  "--activations=measure|skip, key=value)");
    }
  }
  if (file.empty()) throw Error("estimate_memory: --config=FILE is required");
  auto [name, c] = load(program, file, overrides);

  const fabric::DeviceRequest devices = c.get_devices("fabric.devices");
  int64_t local = 1;
  if (!devices.ids.empty())
    local = static_cast<int64_t>(devices.ids.size());
  else if (!devices.is_auto && devices.count > 0)
    local = devices.count;
  const int64_t world = local * c.get_int("fabric.num_nodes");
  const int64_t batch = c.is_auto("data.batch_size") ? 0 : c.get_int("data.batch_size");
  // The precision as a CPU runs it: its parameter dtype, its autocast (bf16; fp16 under 16-mixed).
  fabric::Precision precision(fabric::parse_precision(c.get_string("fabric.precision")),
                              c10::DeviceType::CPU);
  std::string chosen = c.get_string("fabric.strategy");
  if (chosen == "auto") chosen = world > 1 ? "ddp" : "single_device";
  if (chosen == "ddp" && c.get_bool("fabric.ddp.shard_optimizer_state")) chosen = "ddp+zero1";

  Model m = build(name, c);
  const int64_t bytes = static_cast<int64_t>(c10::elementSize(precision.param_dtype()));
  int64_t trainable = 0, frozen_params = 0, buffers = 0;
  for (const auto& p : m.module->parameters()) {
    int64_t& sum = p.requires_grad() ? trainable : frozen_params;
    sum = plus(sum, times(p.numel(), bytes));
  }
  for (const auto& b : m.module->buffers())
    buffers = plus(buffers, times(b.numel(), static_cast<int64_t>(b.element_size())));
  const int64_t frozen = plus(frozen_params, buffers);
  // The optimizer on the meta parameters (no memory); its state takes their training dtype.
  const auto optimizer = fabric::make_optimizer(c, *m.module);
  const int64_t optimizer_bytes =
      times(fabric::optimizer_state_bytes_expected(*optimizer) / 4, bytes);

  // fsdp: the units of the wrapping policy; the largest other than the root (with its frozen
  // siblings) is whole in the forward and, with its gradients, in the backward; the root stays
  // whole. Frozen parameters are sharded too.
  fabric::strategies::ShardingPolicy policy;
  const auto fsdp = fabric::fsdp_options(c);
  policy.wrap_modules = fsdp.wrap_modules;
  policy.min_unit_params = fsdp.min_unit_params;
  int64_t largest_unit = 0, largest_gradients = 0, root_unit = 0, units = 0;
  std::map<size_t, std::pair<int64_t, int64_t>> groups;  // whole bytes, gradient bytes
  for (const auto& u : fabric::strategies::ShardedParameters::plan_units(*m.module, policy)) {
    int64_t n = 0;
    for (const auto& p : u.params) n = plus(n, times(p.numel(), bytes));
    if (!u.frozen) ++units;
    if (u.root) {
      root_unit = plus(root_unit, n);
      continue;
    }
    auto& [whole, gradients] = groups[u.group];
    whole = plus(whole, n);
    if (!u.frozen) gradients = plus(gradients, n);
  }
  for (const auto& [group, sizes] : groups) {
    largest_unit = std::max(largest_unit, sizes.first);
    largest_gradients = std::max(largest_gradients, sizes.second);
  }

  Activations act;
  if (activations) {
    try {
      act = measure(m, precision, trainable, std::max<int64_t>(batch, 1));
    } catch (const std::exception& e) {
      // Measuring materialises the model here: one too large for this machine is said so.
      const std::string what = e.what();
      if (what.find("allocate") == std::string::npos && what.find("memory") == std::string::npos)
        throw;
      throw Error(what.substr(0, what.find('\n')) +
                  "; the activations are measured by running the model on this machine, which "
                  "cannot hold it: --activations=skip counts the rest");
    }
  }
  const int64_t activation_bytes = plus(times(act.per_example, batch), act.fixed);

  struct Row {
    std::string strategy;
    int64_t ranks, parameters, gradients, optimizer, buffers, activations;
  };
  const int64_t n = std::max<int64_t>(world, 1);
  // Every row's total below is at most this sum (fsdp's units are parts of the parameters).
  plus(plus(plus(plus(plus(trainable, frozen), trainable), optimizer_bytes), times(trainable, 3)),
       activation_bytes);
  std::vector<Row> rows = {
      {"single_device", 1, trainable + frozen, trainable, optimizer_bytes, 0, activation_bytes},
      {"ddp", n, trainable + frozen, trainable, optimizer_bytes, n > 1 ? trainable : 0,
       activation_bytes},
      {"ddp+zero1", n, trainable + frozen, trainable, optimizer_bytes / n, n > 1 ? trainable : 0,
       activation_bytes},
      {"fsdp", n, (trainable + frozen_params) / n + buffers, trainable / n, optimizer_bytes / n,
       plus(plus(root_unit, largest_unit), largest_gradients), activation_bytes},
  };
  if (json) {
    nlohmann::json out = {{"program", name},
                          {"model", m.description},
                          {"precision", c.get_string("fabric.precision")},
                          {"world_size", world},
                          {"batch_size", batch},
                          {"strategy", chosen},
                          {"fsdp_units", units},
                          {"activation_bytes_per_example", act.per_example},
                          {"rows", nlohmann::json::array()}};
    for (const auto& r : rows)
      out["rows"].push_back(
          {{"strategy", r.strategy},
           {"ranks", r.ranks},
           {"parameters", r.parameters},
           {"gradients", r.gradients},
           {"optimizer", r.optimizer},
           {"buffers", r.buffers},
           {"activations", r.activations},
           {"total", r.parameters + r.gradients + r.optimizer + r.buffers + r.activations}});
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << name << ": " << m.description << ", " << (trainable + frozen) / bytes
            << " parameters and buffers, precision " << c.get_string("fabric.precision")
            << ", optimizer " << c.get_string("optimizer.name") << ", "
            << (batch > 0 ? std::to_string(batch) : std::string("auto"))
            << " examples per process, " << world << (world == 1 ? " process" : " processes")
            << "\n";
  std::cout << "MiB per process     parameters  gradients  optimizer  buffers  activations  "
               "total\n";
  for (const auto& r : rows) {
    char line[256];
    const int64_t total = r.parameters + r.gradients + r.optimizer + r.buffers + r.activations;
    std::snprintf(line, sizeof(line), "%s%-16s %12s %10s %10s %8s %12s %8s\n",
                  r.strategy == chosen ? "* " : "  ", r.strategy.c_str(), mib(r.parameters).c_str(),
                  mib(r.gradients).c_str(), mib(r.optimizer).c_str(), mib(r.buffers).c_str(),
                  activations ? mib(r.activations).c_str() : "-", mib(total).c_str());
    std::cout << line;
  }
  std::cout << "(* the config's strategy; ddp's buffers: its gradient buckets; fsdp's: the root "
               "unit and twice the largest of "
            << units
            << " units, gathered; activations measured on this CPU at the batch size (up to 16, "
               "linear beyond) and half of it"
            << (activations ? "" : ": skipped") << ")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::cerr << "error: " << what.substr(0, what.find('\n')) << "\n";
    return 2;
  }
}
