// bazel run //tools/bench:pretrained_memory -- bench.folder=DIR [fabric.devices=2
//     fabric.strategy=fsdp | model_parallel fabric.model_parallel.tensor_parallel_size=2]
//     [bench.load=per_rank | whole | none]
//
// Memory per rank while a Hugging Face Llama folder (e.g. tools/bench/make_random_llama.py's, in
// /tmp) is loaded into a fabric::models::Llama built by an empty init and set up:
//   per_rank  Fabric::load_weights(module, tensors, folder): each rank copies its elements from
//             the memory-mapped files
//   whole     what load_weights did before: the module materialized whole on every rank
//             (Strategy::materialize_parameters) and loaded by fabric::load_state_dict
//   none      setup only (the baseline)
// Printed per rank, one line each:
//   rank R: model_mb=... init_tensors_mb=... setup_tensors_mb=... load_peak_tensors_mb=...
//   after_load_tensors_mb=...
//           vmhwm_mb=... rss_anon_mb=... rss_file_mb=...
// model_mb: the whole model's float32 parameters; *_tensors_mb: LibTorch tensor storage counted by
// fabric's CPU allocator (fabric/accelerators/memory.h: what this process allocated; the
// memory-mapped file is not counted); vmhwm_mb: peak resident memory (/proc/self/status VmHWM:
// the program and its libraries, allocations, and the pages of the mapped files it read);
// rss_anon_mb / rss_file_mb: resident memory after the load, allocated / pages of mapped files
// (the page cache's, shared, dropped under pressure). Not a test: nothing is asserted.
// Numbers and commands: docs/pretrained.md, "Memory per rank".
#include <torch/types.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>

#include "fabric/accelerators/memory.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/fabric.h"
#include "fabric/hf/llama.h"
#include "fabric/hf/weights.h"
#include "fabric/main.h"
#include "fabric/models/llama.h"

namespace fs = std::filesystem;

namespace {

// Fields of /proc/self/status in MiB ("VmHWM", "RssAnon", "RssFile").
std::map<std::string, double> status_mb() {
  std::map<std::string, double> out;
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, colon);
    if (key == "VmHWM" || key == "RssAnon" || key == "RssFile")
      out[key] = std::stod(line.substr(colon + 1)) / 1024.0;  // kB
  }
  return out;
}

double mb(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  fabric::ConfigSchema schema = fabric::training_schema();
  schema.add("bench.folder", fabric::KeySpec::string(""));
  schema.add("bench.load", fabric::KeySpec::choice({"per_rank", "whole", "none"}, "per_rank"));
  return fabric::run_main(argc, argv, schema, [](const fabric::Config& c) {
    fabric::Fabric fabric(c);
    return fabric.launch([&](fabric::Fabric& f) {
      const torch::Device cpu(torch::kCPU);
      fabric::memory_stats(cpu);  // counting from here on
      const fs::path folder = c.get_string("bench.folder");
      const std::string load = c.get_string("bench.load");
      const fabric::models::LlamaConfig config = fabric::hf::read_llama_config(folder);
      auto model = f.init_module([&] { return fabric::models::Llama(config); }, true);
      const fabric::hf::Weights weights = fabric::hf::read_weights(folder);
      const fabric::StateDict tensors = fabric::hf::checked_weights(*model, weights, folder);
      const int64_t init_bytes = fabric::memory_stats(cpu).allocated;
      f.setup(model);
      const int64_t setup_bytes = fabric::memory_stats(cpu).allocated;
      fabric::reset_peak_memory(cpu);
      if (load == "per_rank") {
        f.load_weights(model, tensors, folder.string());
      } else if (load == "whole") {
        const fabric::ScopeGuard whole = f.strategy().materialize_parameters(*model, true);
        fabric::load_state_dict(*model, tensors, folder.string());
      }
      const fabric::MemoryStats after = fabric::memory_stats(cpu);
      auto status = status_mb();
      char line[512];
      std::snprintf(line, sizeof(line),
                    "rank %lld: load=%s model_mb=%.0f init_tensors_mb=%.0f setup_tensors_mb=%.0f "
                    "load_peak_tensors_mb=%.0f after_load_tensors_mb=%.0f vmhwm_mb=%.0f "
                    "rss_anon_mb=%.0f rss_file_mb=%.0f",
                    static_cast<long long>(f.global_rank()), load.c_str(),
                    mb(config.parameters() * 4), mb(init_bytes), mb(setup_bytes), mb(after.peak),
                    mb(after.allocated), status["VmHWM"], status["RssAnon"], status["RssFile"]);
      for (int64_t r = 0; r < f.world_size(); ++r) {
        if (r == f.global_rank()) std::cout << line << std::endl;
        f.barrier();
      }
      return 0;
    });
  });
}
