// Fabric::find_batch_size (data.batch_size: auto): the search, and the training-step trial the
// examples use.
#include <torch/types.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "fabric/accelerators/memory.h"
#include "fabric/checkpoint/rng_state.h"
#include "fabric/connector.h"
#include "fabric/fabric.h"
#include "fabric/training/state_bytes.h"

namespace fabric {

int64_t Fabric::find_batch_size(const std::function<void(int64_t)>& trial, int64_t start,
                                int64_t most, std::vector<BatchSizeTrial>* trials) {
  if (start < 1 || most < start)
    throw Error("find_batch_size: needs 1 <= start <= most (start " + std::to_string(start) +
                ", most " + std::to_string(most) + ")");
  // The trials draw random numbers (dropout): the generators are where they were afterwards.
  const RngState generators = get_rng_state();
  const ScopeGuard restore([&generators] { set_rng_state(generators); });
  // On a CPU without fabric.tensor_memory_limit_gb the search is held to this process's share
  // of the memory available now, so that a size that would make the machine swap (or wake the
  // kernel's OOM killer) counts as not fitting.
  std::optional<ScopeGuard> held;
  const c10::Device here = device();
  if (here.is_cpu() && memory_stats(here).limit == 0) {
    const int64_t local = std::max<int64_t>(1, static_cast<int64_t>(setup_->devices.size()));
    if (const int64_t available = available_host_memory(); available > 0) {
      set_memory_limit(here, memory_stats(here).allocated + available / local);
      held.emplace([here] { set_memory_limit(here, 0); });
    }
  }
  int64_t b = start, best = 0;
  bool failed = false;
  std::string line = "data.batch_size: auto:";
  std::string reason;
  while (true) {
    bool fits = true;
    try {
      trial(b);
    } catch (const std::exception& e) {
      if (!is_out_of_memory(e)) throw;
      fits = false;
      reason = e.what();
      reason = reason.substr(0, reason.find('\n'));
    }
    if (!fits) release_cached_memory(device());
    // A size fits when it fits on every rank.
    fits = all_reduce(fits ? 1.0 : 0.0, ReduceOp::kMin) > 0;
    if (trials) trials->push_back({b, fits});
    line += " " + std::to_string(b) + (fits ? " fits," : " out of memory,");
    if (fits) {
      best = b;
      if (failed || b >= most) break;
      b = std::min(2 * b, most);
    } else {
      failed = true;
      if (best > 0) break;
      if (b == 1)
        throw Error("data.batch_size: auto: not even a batch of 1 fits (" + reason +
                    "); free memory, shard the model (fabric.strategy: fsdp) or raise the limit");
      b /= 2;
    }
  }
  print(line, " using ", best);
  return best;
}

int64_t Fabric::find_batch_size(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                const std::function<torch::Tensor(int64_t)>& loss, int64_t start,
                                int64_t most, std::vector<BatchSizeTrial>* trials) {
  std::vector<torch::Tensor> buffers;
  for (const auto& b : module.buffers()) buffers.push_back(b.detach().clone());
  const int64_t state_bytes = optimizer_state_bytes_expected(optimizer);
  const int64_t chosen = find_batch_size(
      [&](int64_t b) {
        const torch::Tensor reserved = torch::empty(
            {state_bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(device()));
        {
          const ScopeGuard no_sync = strategy_->no_backward_sync();
          torch::Tensor value;
          {
            const AutocastGuard guard = autocast();
            value = loss(b);
          }
          backward(value);
        }
        optimizer.zero_grad(/*set_to_none=*/true);
        // The module's own gradients too: under fsdp and ZeRO-1 the optimizer holds shards, and
        // the unsynchronized whole gradients left in the parameters joined the first real step.
        for (auto& p : module.parameters())
          if (p.grad().defined()) p.mutable_grad().reset();
      },
      start, most, trials);
  torch::NoGradGuard no_grad;
  const auto now = module.buffers();
  for (size_t i = 0; i < now.size() && i < buffers.size(); ++i) now[i].copy_(buffers[i]);
  return chosen;
}

}  // namespace fabric
