#include "strategies/model_parallel.h"

#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fabric/checkpoint/piece_layout.h"
#include "fabric/core/error.h"
#include "fabric/distributed/device_mesh.h"
#include "fabric/distributed/rendezvous.h"
#include "fabric/nn/empty_init.h"
#include "fabric/nn/pipeline_staged.h"
#include "strategies/optimizer_shard.h"

namespace fabric::strategies {

ModelParallel::ModelParallel(std::shared_ptr<ClusterEnvironment> environment, torch::Device device,
                             std::unique_ptr<Precision> precision, const DdpOptions& ddp,
                             FsdpOptions fsdp, ModelParallelOptions options,
                             std::vector<std::string> argv)
    : Fsdp(std::move(environment), device, std::move(precision), ddp, std::move(fsdp),
           std::move(argv)),
      options_mp_(options) {
  key_ = "fabric.strategy: model_parallel";
}

ModelParallel::~ModelParallel() = default;

ModelParallel::Split::Split(fabric::nn::TensorParallelShard shard_, int64_t along_,
                            std::vector<int64_t> whole_sizes_)
    : shard(std::move(shard_)), along(along_), whole_sizes(std::move(whole_sizes_)) {
  slice_sizes = whole_sizes;
  slice_sizes[along] /= shard.size;
  layout = slices_layout(whole_sizes, along, shard.style.parts, shard.size);
  start = shard.rank * c10::multiply_integers(slice_sizes);
}

Error ModelParallel::unsupported(const std::string& what) const {
  return Error(key_ + ": " + what);
}

int64_t ModelParallel::data_parallel_rank() const {
  // pp is the outermost dimension (every stage has the same dp coordinates); cp lies between
  // dp_shard and tp.
  return global_rank() / (options_mp_.tensor_parallel_size * options_mp_.context_parallel_size) %
         options_mp_.data_parallel_size;
}

int64_t ModelParallel::tp_rank() const { return global_rank() % options_mp_.tensor_parallel_size; }

int64_t ModelParallel::replica() const {
  const int64_t stage_ranks = world_size() / options_mp_.pipeline_parallel_size;
  return global_rank() % stage_ranks / (stage_ranks / options_mp_.replicate_size);
}

c10::intrusive_ptr<c10d::ProcessGroup> ModelParallel::replicate_group() const {
  if (!mesh_ || options_mp_.replicate_size == 1) return {};
  return mesh_->group("dp_replicate");
}

void ModelParallel::setup_environment() {
  Fsdp::setup_environment();
  const int64_t tp = options_mp_.tensor_parallel_size, dp = options_mp_.data_parallel_size;
  const int64_t pp = options_mp_.pipeline_parallel_size, cp = options_mp_.context_parallel_size;
  if (pp * cp * tp * dp != world_size())
    throw Error(key_ + ": fabric.model_parallel.pipeline_parallel_size " + std::to_string(pp) +
                " x data_parallel_size " + std::to_string(dp) + " x context_parallel_size " +
                std::to_string(cp) + " x tensor_parallel_size " + std::to_string(tp) +
                " is not the world size " + std::to_string(world_size()));
  const int64_t copies = options_mp_.replicate_size;
  std::vector<distributed::MeshDim> dims{{"dp_shard", dp / copies}, {"tp", tp}};
  std::vector<distributed::MeshFlatten> flatten;
  if (cp > 1) {  // fsdp shards over dp_shard x cp: the cp ranks' gradients are averaged too
    dims.insert(dims.begin() + 1, {"cp", cp});
    flatten.push_back({"dp_shard_cp", {"dp_shard", "cp"}});
  }
  if (copies > 1) dims.insert(dims.begin(), {"dp_replicate", copies});
  // pp outermost; "stage": the ranks of one stage (dp x tp), which start from the same values.
  if (pp > 1) {
    flatten.push_back({"stage", {}});
    for (const auto& d : dims) flatten.back().dims.push_back(d.name);
    dims.insert(dims.begin(), {"pp", pp});
  }
  mesh_ = std::make_unique<distributed::DeviceMesh>(rendezvous()->store(),
                                                    rendezvous()->group_options(), dims, flatten);
}

const c10::intrusive_ptr<c10d::ProcessGroup>& ModelParallel::data_parallel_group(
    const std::string& what) const {
  if (!mesh_) return group_for(what);  // throws before setup_environment
  return mesh_->group(mesh_->has("cp") ? "dp_shard_cp" : "dp_shard");
}

void ModelParallel::setup_module(torch::nn::Module& module) {
  if (!mesh_) group_for("setup_module");  // names the missing setup_environment
  if (split_module_ != nullptr)
    throw unsupported("splits one module per process; this job set up a second one");
  if (const int64_t pp = options_mp_.pipeline_parallel_size;
      pp > 1 && dynamic_cast<const fabric::nn::PipelineStaged*>(&module) == nullptr)
    throw Error("fabric.model_parallel.pipeline_parallel_size: " + std::to_string(pp) +
                ", but the module (" + module.name() +
                ") is a whole model, not a model's pipeline stages: every pipeline rank would "
                "train all of it on the same data; set it to 1, or build the stages and run them "
                "with a PipelineRunner as examples:gpt does (docs/tensor_parallel.md)");
  fabric::nn::TensorParallelPlan plan;
  const int64_t tp = mesh_->group("tp")->getSize();
  if (plan_) {
    plan = *plan_;
  } else if (const auto* planned =
                 dynamic_cast<const fabric::nn::TensorParallelPlanned*>(&module)) {
    plan = planned->tensor_parallel_plan();
  } else if (tp == 1) {
    // tensor_parallel_size 1 is plain fsdp (HSDP over nodes): nothing to split, no plan needed.
  } else {
    throw unsupported("the module (" + module.name() +
                      ") carries no tensor-parallel plan: derive its class from "
                      "fabric::nn::TensorParallelPlanned (fabric/all.h) and return the plan from "
                      "tensor_parallel_plan() (docs/tensor_parallel.md), or set "
                      "fabric.model_parallel.tensor_parallel_size: 1");
  }
  plan.sequence_parallel = plan.sequence_parallel || options_mp_.sequence_parallel;
  if (tp == 1 && options_mp_.sequence_parallel && global_rank() == 0)
    std::cerr << "warning: fabric.model_parallel.sequence_parallel has no effect at "
                 "tensor_parallel_size 1 (nothing is split over tp)"
              << std::endl;
  if (tp == 1) plan.sequence_parallel = false;
  if (!fabric::has_meta_tensors(module)) {
    // Rank 0's values everywhere before they are cut (fsdp then spreads each slice over its
    // dp_shard group); an empty init's are the same everywhere by construction (Fsdp replays
    // from rank 0's generator, initial_value cuts them).
    module.to(device_);
    std::vector<torch::Tensor> state = module.parameters();
    for (const auto& b : module.buffers()) state.push_back(b);
    torch::NoGradGuard no_grad;
    c10d::broadcast_coalesced(mesh_->has("stage") ? mesh_->group("stage") : process_group(),
                              float8_as_bytes(std::move(state)), 250 * 1024 * 1024, 0);
    values_broadcast_ = true;
  }
  const std::vector<std::string> split = fabric::nn::parallelize(module, plan, mesh_->group("tp"));
  split_module_ = &module;
  try {  // a module owned by a shared_ptr (every ModuleHolder's) may be gone by teardown
    owner_ = module.shared_from_this();
    owned_ = true;
  } catch (const std::bad_weak_ptr&) {
    owned_ = false;
  }
  std::vector<std::pair<std::string, torch::nn::Module*>> all = {{"", &module}};
  for (const auto& item : module.named_modules("", /*include_self=*/false))
    all.emplace_back(item.key(), item.value().get());
  for (const auto& [name, m] : all) {
    const std::string prefix = name.empty() ? "" : name + ".";
    if (auto* l = m->as<fabric::nn::LinearImpl>(); l != nullptr && l->parallel()) {
      const auto& p = *l->parallel();
      module_splits_.emplace(prefix + "weight", Split{p, p.dim, p.full_sizes});
      if (l->bias.defined() && p.dim == 0)
        module_splits_.emplace(prefix + "bias", Split{p, 0, {p.full_sizes[0]}});
      // A LoRA adapter's tensor cut with the layer (a column layer's lora_B, a row layer's
      // lora_A): saved, loaded and gathered like the weight.
      if (const auto cut = l->lora_cut())
        module_splits_.emplace(prefix + cut->name, Split{p, cut->along, cut->whole_sizes});
    } else if (auto* e = m->as<fabric::nn::EmbeddingImpl>(); e != nullptr && e->parallel()) {
      const auto& p = *e->parallel();
      module_splits_.emplace(prefix + "weight", Split{p, 0, p.full_sizes});
    }
  }
  const auto named = module.named_parameters();
  for (const auto& [name, split] : module_splits_)
    split_of_tensor_[named[name].unsafeGetTensorImpl()] = &split;
  if (global_rank() == 0 && tp == 1)
    std::cerr << name() << ": " << mesh_->describe()
              << ", tensor_parallel_size 1: no module split (fsdp over dp_shard"
              << (mesh_->has("cp") ? " x cp)" : ")") << std::endl;
  else if (global_rank() == 0)
    std::cerr << name() << ": " << mesh_->describe() << ", " << split.size()
              << (split.size() == 1 ? " module" : " modules") << " split over tp"
              << (plan.sequence_parallel ? ", sequence parallel" : "") << std::endl;
  Fsdp::setup_module(module);
}

torch::Tensor ModelParallel::initial_value(const torch::Tensor& held, const torch::Tensor& value) {
  auto it = split_of_tensor_.find(held.unsafeGetTensorImpl());
  if (it == split_of_tensor_.end()) return value;
  return it->second->shard.slice(value, it->second->along).contiguous();
}

void ModelParallel::setup_optimizer(torch::optim::Optimizer& optimizer) {
  // Each of the optimizer's parameters (in its order, as checkpoints number them): split or not.
  std::map<const void*, const Split*> by_tensor;
  const auto named = split_module_ != nullptr ? split_module_->named_parameters()
                                              : torch::OrderedDict<std::string, torch::Tensor>();
  for (const auto& [name, split] : module_splits_)
    by_tensor[named[name].unsafeGetTensorImpl()] = &split;
  optimizer_splits_.clear();
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) {
      auto it = by_tensor.find(p.unsafeGetTensorImpl());
      optimizer_splits_.push_back(it == by_tensor.end() ? std::nullopt
                                                        : std::optional<Split>(*it->second));
    }
  Fsdp::setup_optimizer(optimizer);
  // Over the world each element of a shard is counted once per copy (HSDP), and a tensor not
  // split over tp once per tp rank too.
  const double tp = static_cast<double>(options_mp_.tensor_parallel_size);
  const double copies = static_cast<double>(options_mp_.replicate_size);
  torch::nn::Module& module = *split_module_;
  // A pipeline's stages hold different parameters (a tied embedding counted on one of them).
  shard_->set_norm_scope(process_group(), [&](const torch::Tensor& p) {
    if (uncounted_.count(p.unsafeGetTensorImpl())) return 0.0;
    return (fabric::nn::is_split_parameter(module, p) ? 1.0 : 1.0 / tp) / copies;
  });
}

torch::Tensor ModelParallel::clip_gradients_norm(const std::vector<torch::Tensor>& parameters,
                                                 torch::optim::Optimizer& optimizer,
                                                 double max_norm, double norm_type) {
  if (shard_of(optimizer) == nullptr)
    throw unsupported("clip_gradients of an optimizer that was not set up with the module");
  return Fsdp::clip_gradients_norm(parameters, optimizer, max_norm, norm_type);
}

ScopeGuard ModelParallel::materialize_parameters(torch::nn::Module& module, bool write_back) {
  if (&module != split_module_) return Fsdp::materialize_parameters(module, write_back);
  auto fsdp_whole = std::make_shared<ScopeGuard>(Fsdp::materialize_parameters(module, write_back));
  struct Held {
    torch::Tensor param, slice;
    const Split* split;
  };
  std::vector<Held> held;
  torch::NoGradGuard no_grad;
  const auto params = module.named_parameters();
  for (const auto& [name, split] : module_splits_) {
    torch::Tensor p = params[name];
    held.push_back({p, p.detach(), &split});
    p.set_data(split.shard.gather(p.detach(), split.along));
  }
  return ScopeGuard([held, fsdp_whole, write_back]() mutable {
    torch::NoGradGuard no_grad;
    for (Held& h : held) {
      if (write_back) h.slice.copy_(h.split->shard.slice(h.param.detach(), h.split->along));
      h.param.set_data(h.slice);
    }
    fsdp_whole.reset();  // fsdp takes the slices' values back into its shards
  });
}

void ModelParallel::teardown() {
  // Whole again: fsdp's shards first (over dp_shard), then the tp slices (over tp), while the
  // groups still exist.
  keep_mesh_ = true;
  release_shards_whole();
  keep_mesh_ = false;
  if (split_module_ != nullptr && (!owned_ || !owner_.expired()))
    fabric::nn::unparallelize(*split_module_);
  split_module_ = nullptr;
  ParallelStrategy::teardown();  // release(): the mesh's groups end before the rendezvous
}

c10::intrusive_ptr<c10d::ProcessGroup> ModelParallel::context_parallel_group() const {
  if (!mesh_ || !mesh_->has("cp")) return {};
  return mesh_->group("cp");
}

c10::intrusive_ptr<c10d::ProcessGroup> ModelParallel::pipeline_group() const {
  if (!mesh_ || !mesh_->has("pp")) return {};
  return mesh_->group("pp");
}

void ModelParallel::set_shared_parameter(const torch::Tensor& parameter, bool counted_here) {
  if (shard_ != nullptr)
    throw unsupported(
        "set_shared_parameter after the optimizer was set up; call it before "
        "Fabric::setup(model, optimizer)");
  if (!counted_here) uncounted_.insert(parameter.unsafeGetTensorImpl());
}

std::vector<c10::IValue> ModelParallel::exchange_pipeline(const c10::IValue& mine, bool everyone) {
  const auto pg = pipeline_group();
  if (!pg) return {mine};
  // Each stage's value pickled: the byte counts gathered, then the bytes (padded to the longest
  // for an all-gather, or sent to the first rank).
  constexpr int kSizeTag = 71003, kBytesTag = 71004;
  const std::vector<char> bytes = torch::jit::pickle_save(mine);
  const int64_t n = pg->getSize(), me = pg->getRank();
  std::vector<torch::Tensor> size{torch::tensor({static_cast<int64_t>(bytes.size())})};
  auto load = [](const torch::Tensor& data, int64_t count) {
    const char* p = static_cast<const char*>(data.data_ptr());
    return torch::jit::pickle_load(std::vector<char>(p, p + count));
  };
  if (everyone) {
    std::vector<std::vector<torch::Tensor>> sizes(1);
    for (int64_t k = 0; k < n; ++k) sizes[0].push_back(torch::zeros({1}, torch::kLong));
    distributed::wait(pg->allgather(sizes, size), "pipeline checkpoint: all_gather of sizes");
    int64_t longest = 0;
    for (const auto& t : sizes[0]) longest = std::max(longest, t.item<int64_t>());
    std::vector<torch::Tensor> padded{torch::zeros({longest}, torch::kUInt8)};
    std::memcpy(padded[0].data_ptr(), bytes.data(), bytes.size());
    std::vector<std::vector<torch::Tensor>> all(1);
    for (int64_t k = 0; k < n; ++k) all[0].push_back(torch::empty({longest}, torch::kUInt8));
    distributed::wait(pg->allgather(all, padded), "pipeline checkpoint: all_gather");
    std::vector<c10::IValue> out;
    for (int64_t k = 0; k < n; ++k)
      out.push_back(k == me ? mine : load(all[0][k], sizes[0][k].item<int64_t>()));
    return out;
  }
  if (me != 0) {
    distributed::wait(pg->send(size, 0, kSizeTag), "pipeline checkpoint: send of its size");
    std::vector<torch::Tensor> data{torch::from_blob(
        const_cast<char*>(bytes.data()), {static_cast<int64_t>(bytes.size())}, torch::kUInt8)};
    distributed::wait(pg->send(data, 0, kBytesTag), "pipeline checkpoint: send");
    return {mine};
  }
  std::vector<c10::IValue> out{mine};
  for (int64_t k = 1; k < n; ++k) {
    std::vector<torch::Tensor> count{torch::zeros({1}, torch::kLong)};
    distributed::wait(pg->recv(count, static_cast<int>(k), kSizeTag),
                      "pipeline checkpoint: recv of a size");
    std::vector<torch::Tensor> data{torch::empty({count[0].item<int64_t>()}, torch::kUInt8)};
    distributed::wait(pg->recv(data, static_cast<int>(k), kBytesTag), "pipeline checkpoint: recv");
    out.push_back(load(data[0], count[0].item<int64_t>()));
  }
  return out;
}

bool ModelParallel::first_of_stage() const {
  return !mesh_ || !mesh_->has("stage") || mesh_->group("stage")->getRank() == 0;
}

void ModelParallel::release() {
  Fsdp::release();
  // After an error the module keeps its slices: the groups that could gather them end here.
  if (!keep_mesh_) mesh_.reset();
}

}  // namespace fabric::strategies
