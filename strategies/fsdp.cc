#include "strategies/fsdp.h"

#include <torch/types.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"
#include "fabric/nn/empty_init.h"
#include "fabric/nn/fp8.h"
#include "strategies/optimizer_shard.h"
#include "strategies/sharded_parameters.h"

namespace fabric::strategies {

Fsdp::Fsdp(std::shared_ptr<ClusterEnvironment> environment, torch::Device device,
           std::unique_ptr<Precision> precision, const DdpOptions& ddp, FsdpOptions options,
           std::vector<std::string> argv)
    : ParallelStrategy(std::move(environment), device, std::move(precision),
                       rendezvous_options(ddp, std::move(argv))),
      options_(std::move(options)),
      key_("fabric.strategy: fsdp") {}

Fsdp::~Fsdp() = default;

void Fsdp::release() {
  shard_.reset();
  sharded_.reset();
}

std::optional<c10::IValue> Fsdp::local_module_state(torch::nn::Module& module) {
  if (&module != module_ || !sharded_) return std::nullopt;
  return sharded_->local_state(module);
}

std::optional<PieceRange> Fsdp::wanted_module_piece(const torch::nn::Module& module,
                                                    const std::string& path, at::IntArrayRef sizes,
                                                    at::IntArrayRef strides,
                                                    const std::optional<PieceLayout>& layout) {
  // A tensor in a layout (model_parallel's) is not in fsdp's order: whole.
  if (&module != module_ || !sharded_ || layout) return std::nullopt;
  return sharded_->wanted(path, sizes, strides);
}

std::optional<std::function<void()>> Fsdp::prepare_local_module_state(torch::nn::Module& module,
                                                                      const c10::IValue& value,
                                                                      const std::string& source) {
  if (&module != module_ || !sharded_) return std::nullopt;
  return sharded_->prepare_load(module, value, source);
}

ParameterParts Fsdp::parameter_parts(torch::nn::Module& module) {
  if (&module != module_ || !sharded_) return Strategy::parameter_parts(module);
  ParameterParts out;
  out.parts = sharded_->parts(module);
  out.changed = [this] {
    if (sharded_) sharded_->after_step();  // gathered units hold the values before the write
  };
  // Rank r of the data-parallel group holds the r-th contiguous run of the parameter's elements:
  // joined in rank order (runs of different lengths: padded to the longest for the all-gather).
  std::vector<std::vector<int64_t>> sizes;
  for (const auto& part : out.parts) sizes.push_back(part.sizes);
  out.gather = [this, sizes = std::move(sizes)](const torch::Tensor& part, size_t i) {
    torch::NoGradGuard no_grad;
    const std::string what = "gathering a parameter's parts";
    c10d::ProcessGroup& group = *data_parallel_group(what);
    // Under cpu_offload a part is in host memory; the collectives take the device's tensors.
    const torch::Tensor flat = part.to(device_).contiguous().view(-1);
    const auto counts = distributed::all_gather(
        group, torch::full({1}, flat.numel(), flat.options().dtype(torch::kLong)), what);
    int64_t longest = 0;
    for (const auto& c : counts) longest = std::max(longest, c.item<int64_t>());
    const torch::Tensor padded = flat.numel() == longest
                                     ? flat
                                     : torch::cat({flat, flat.new_zeros({longest - flat.numel()})});
    std::vector<torch::Tensor> runs = distributed::all_gather(group, padded, what);
    for (size_t r = 0; r < runs.size(); ++r)
      runs[r] = runs[r].narrow(0, 0, counts[r].item<int64_t>());
    const torch::Tensor whole = torch::cat(runs);
    if (i >= sizes.size() || whole.numel() != c10::multiply_integers(sizes[i]))
      throw Error("fsdp: the ranks' parts of parameter " + std::to_string(i) +
                  " do not make up the whole tensor");
    return whole.view(sizes[i]).to(part.device());
  };
  return out;
}

c10::intrusive_ptr<c10d::ProcessGroup> Fsdp::replicate_group() const { return {}; }

void Fsdp::teardown() {
  // Every rank gets here together after the user's function returned: the parameters take
  // their full values back (collective) before the process group ends.
  release_shards_whole();
  ParallelStrategy::teardown();
}

void Fsdp::release_shards_whole() {
  if (sharded_ && built_empty_) {
    sharded_->drop_to_meta();
  } else if (sharded_) {
    sharded_->gather_all_into_parameters();
  }
  release();
}

void Fsdp::setup_module(torch::nn::Module& module) {
  const auto& pg = data_parallel_group("setup_module");
  if (sharded_) throw Error(key_ + ": shards one module per process; this job set up a second one");
  // An empty init (fabric/nn/empty_init.h) is replayed after the units are formed, each rank
  // keeping only its shard of each value; the module stays on the meta device until then.
  if (options_.cpu_offload && precision_->scaler() != nullptr)
    throw Error(
        "fabric.fsdp.cpu_offload: true with fabric.precision: 16-mixed is not supported (its "
        "loss scaler checks the gradients on the device, the offloaded ones are in host "
        "memory); use bf16-mixed or set fabric.fsdp.cpu_offload: false");
  const std::shared_ptr<InitRecord> empty_init = take_empty_init(module);
  if (!empty_init) module.to(device_);
  convert_module(module);
  // A unit's parameters are gathered for each use and freed after: a float8 cast kept between
  // passes (fabric/nn/fp8.h) would hold whole weights the sharding is there to free.
  for (const auto& p : module.parameters()) fabric::nn::set_fp8_weight_cached(p, false);
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : module.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    names.push_back(item.key());
    params.push_back(item.value());
  }
  if (params.empty()) throw Error(key_ + ": the module has no parameters that require gradients");
  if (empty_init) {
    // Every rank replays from rank 0's generator state: the same values everywhere (over the
    // world: model_parallel's tp partners cut their slices from the same values).
    torch::Tensor state = empty_init->generator_state().to(device_);
    std::vector<torch::Tensor> one{state};
    distributed::wait(process_group()->broadcast(one),
                      "fsdp empty init: broadcast of the generator state");
    empty_init->set_generator_state(state.cpu());
  } else {
    // Same shapes everywhere, then rank 0's values everywhere (every parameter and buffer),
    // unless a strategy built on this one already broadcast them.
    c10d::verify_params_across_processes(pg, params, std::nullopt);
    if (!values_broadcast_) {
      std::vector<torch::Tensor> state = module.parameters();
      for (const auto& b : module.buffers()) state.push_back(b);
      torch::NoGradGuard no_grad;
      c10d::broadcast_coalesced(pg, float8_as_bytes(std::move(state)), 250 * 1024 * 1024, 0);
    }
  }
  ShardingPolicy policy;
  policy.wrap_modules = options_.wrap_modules;
  policy.min_unit_params = options_.min_unit_params;
  policy.reshard_after_forward = options_.reshard_after_forward;
  policy.param_dtype = options_.param_dtype;
  policy.prefetch = options_.prefetch.value_or(
      device_.is_cuda() || distributed::active_cpu_backend(*pg) != "fabric_shm");
  policy.reduce_dtype = options_.reduce_dtype;
  policy.empty_init_device = device_;
  policy.cpu_offload = options_.cpu_offload;
  sharded_ = std::make_unique<ShardedParameters>(module, pg, policy);
  sharded_->set_replicate_group(replicate_group());
  module_ = &module;
  built_empty_ = empty_init != nullptr;
  if (empty_init) {
    empty_init->replay(
        module, [&](const std::string&, torch::Tensor& held, const torch::Tensor& whole) {
          const torch::Tensor value = initial_value(held, whole);
          if (!sharded_->take_initial_value(held, value))  // a buffer, a tied frozen parameter
            replace_data(held, value.to(device_, held.scalar_type()));
        });
  }
  if (global_rank() == 0) {  // the wrapping policy's result, once
    const auto units = sharded_->units();
    int64_t largest = 0, root = 0, frozen = 0;
    size_t frozen_units = 0;
    std::string largest_name;
    for (const auto& u : units) {
      if (u.frozen) {
        frozen += u.elements;
        ++frozen_units;
      } else if (u.root) {
        root = u.elements;
      } else if (u.elements > largest) {
        largest = u.elements;
        largest_name = u.name;
      }
    }
    const size_t wrapped = units.size() - frozen_units - (root > 0 ? 1 : 0);
    const int64_t n = pg->getSize();  // model_parallel's dp_shard (x cp) group
    std::cerr << name() << ": " << sharding_strategy_name(options_.sharding_strategy) << " over "
              << n << (n == 1 ? " rank, " : " ranks, ") << wrapped
              << (wrapped == 1 ? " unit" : " units");
    if (wrapped > 0)
      std::cerr << " (largest '" << largest_name << "', " << largest << " parameters)";
    if (root > 0) std::cerr << " and the root unit (" << root << " parameters)";
    if (wrapped == 0 && root > 0) {
      // Why nothing was split into units: the policy's two rules, with the fix.
      std::string types;
      for (const auto& t : options_.wrap_modules) types += (types.empty() ? "" : ",") + t;
      std::cerr << ": no submodule holds fabric.fsdp.min_unit_params (" << options_.min_unit_params
                << ") parameters or more"
                << (types.empty() ? std::string(" and fabric.fsdp.wrap_modules names no type")
                                  : " or has a type in fabric.fsdp.wrap_modules (" + types + ")")
                << ", so the whole model is gathered at once (fine for a small model; for a "
                   "large one name its block type in fabric.fsdp.wrap_modules or lower "
                   "min_unit_params)";
    }
    if (options_.cpu_offload)
      std::cerr << "; cpu_offload: the shards, their gradients and the optimizer state in host "
                   "memory";
    if (frozen_units > 0)
      std::cerr << "; " << frozen << " frozen parameters (requires_grad false) sharded in "
                << frozen_units << (frozen_units == 1 ? " unit" : " units") << " beside them";
    std::cerr << std::endl;
  }
  params_ = std::move(params);
  param_names_ = std::move(names);
}

void Fsdp::setup_optimizer(torch::optim::Optimizer& optimizer) {
  if (!sharded_)
    throw Error(key_ +
                ": set up the module before its optimizer (Fabric::setup(model, optimizer) does)");
  if (shard_) throw Error(key_ + ": supports one optimizer; this job set up a second one");
  shard_ = std::make_unique<OptimizerShard>(optimizer, params_, param_names_,
                                            data_parallel_group("setup_optimizer"),
                                            sharded_->segments(), key_);
  agree_on_found_inf();
}

void Fsdp::backward(const torch::Tensor& loss) {
  if (!shard_)
    throw Error(key_ +
                ": backward before the optimizer was set up; pass it to "
                "Fabric::setup(model, optimizer)");
  sharded_->begin_backward(sync_, shard_->has_gradients());
  precision_->backward(loss);
  sharded_->end_backward();
  unsynced_ = !sync_;
  if (sync_) {
    shard_->attach_gradients();
    ++synced_backwards_;
  }
}

bool Fsdp::optimizer_step(torch::optim::Optimizer& optimizer) {
  if (!shard_of(optimizer))
    throw Error(key_ +
                ": step of an optimizer that was not set up with the module; pass it to "
                "Fabric::setup(model, optimizer)");
  const bool stepped = precision_->optimizer_step(optimizer);
  sharded_->after_step();
  return stepped;
}

ScopeGuard Fsdp::materialize_parameters(torch::nn::Module& module, bool write_back) {
  if (!sharded_ || &module != module_) return ScopeGuard();
  return sharded_->materialize(write_back);
}

void Fsdp::sync_accumulated_gradients() {
  if (!shard_)
    throw Error(key_ +
                ": gradients synchronized before the optimizer was set up; pass it to "
                "Fabric::setup(model, optimizer)");
  sharded_->begin_backward(/*sync=*/true, shard_->has_gradients());
  sharded_->end_backward();  // every unit: its parameters' accumulated gradients
  shard_->attach_gradients();
  unsynced_ = false;
  ++synced_backwards_;
}

void Fsdp::sync_unsynced_gradients() {
  if (unsynced_) sync_accumulated_gradients();
}

ScopeGuard Fsdp::no_backward_sync() {
  const bool previous = sync_;
  sync_ = false;
  return ScopeGuard([this, previous] { sync_ = previous; });
}

void Fsdp::set_capturable_gradient_sync(bool on) {
  if (on)
    throw Error(key_ +
                ": fabric.cuda_graphs is not supported with it; set fabric.cuda_graphs: false");
}

}  // namespace fabric::strategies
