// Plans applied to a model: parallelize() (checks first, then splits), unparallelize() and
// is_split_parameter(). The layers and collectives they set up are in tensor_parallel.cc.
#include <algorithm>
#include <memory>
#include <utility>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include "fabric/core/error.h"
#include "fabric/nn/empty_init.h"
#include "fabric/nn/tensor_parallel.h"

namespace fabric::nn {

bool plan_pattern_matches(const std::string& pattern, const std::string& name) {
  size_t p = 0, n = 0;
  while (true) {
    const size_t pe = pattern.find('.', p), ne = name.find('.', n);
    const std::string pc = pattern.substr(p, pe == std::string::npos ? std::string::npos : pe - p);
    const std::string nc = name.substr(n, ne == std::string::npos ? std::string::npos : ne - n);
    if (pc != "*" && pc != nc) return false;
    if ((pe == std::string::npos) != (ne == std::string::npos)) return false;
    if (pe == std::string::npos) return true;
    p = pe + 1;
    n = ne + 1;
  }
}

std::vector<std::string> parallelize(torch::nn::Module& model, const TensorParallelPlan& plan,
                                     const ProcessGroupPtr& group) {
  const int64_t size = group->getSize(), rank = group->getRank();
  // First every check, then the splits: an error leaves the model whole.
  struct Match {
    std::string name;
    size_t rule;
    std::shared_ptr<torch::nn::Module> module;
  };
  std::vector<Match> matches;
  std::vector<bool> used(plan.rules.size(), false);
  const auto modules = model.named_modules("", /*include_self=*/false);
  for (const auto& item : modules) {
    size_t r = 0;
    while (r < plan.rules.size() && !plan_pattern_matches(plan.rules[r].first, item.key())) ++r;
    if (r == plan.rules.size()) continue;
    used[r] = true;
    matches.push_back({item.key(), r, item.value()});
  }
  for (size_t r = 0; r < plan.rules.size(); ++r)
    if (!used[r])
      throw ConfigError("tensor parallel plan rule '" + plan.rules[r].first +
                        "' matches no module of the model; module names look like '" +
                        (modules.is_empty() ? std::string("(none)") : modules.keys().back()) +
                        "' ('*' matches one name component)");
  std::vector<TensorParallelShard> shards;
  for (const Match& m : matches) {
    const TensorParallelStyle style = plan.rules[m.rule].second;
    const std::string where = "tensor parallel plan rule '" + plan.rules[m.rule].first + "' (" +
                              style.name() + ") on " + m.name;
    TensorParallelShard shard(group, style, rank, size, 0, {});
    shard.sequence_parallel = plan.sequence_parallel;
    const bool vocab = style.kind == TensorParallelStyle::Kind::kVocab;
    auto* e = m.module->as<EmbeddingImpl>();
    auto* l = m.module->as<LinearImpl>();
    if (vocab ? e == nullptr : l == nullptr)
      throw ConfigError(where + ": the module is a " + m.module->name() +
                        ", not a fabric::nn::" + (vocab ? "Embedding" : "Linear") +
                        "; build it as fabric::nn::" + (vocab ? "Embedding" : "Linear") +
                        " (same options and parameters) to split it");
    if (vocab ? e->parallel().has_value() : l->parallel().has_value())
      throw Error(where + ": the module is split already");
    shard.full_sizes = (vocab ? e->weight : l->weight).sizes().vec();
    shard.dim = style.kind == TensorParallelStyle::Kind::kRow ? 1 : 0;
    const int64_t n = shard.full_sizes[shard.dim];
    const std::string extent = std::string(vocab            ? "vocabulary size"
                                           : shard.dim == 0 ? "out_features"
                                                            : "in_features") +
                               " " + std::to_string(n);
    const std::string parts =
        style.parts > 1 ? std::to_string(style.parts) + " parts x " : std::string();
    // Whole units first (a head count names the key to change), then the plain division.
    if (style.unit > 1 && style.parts >= 1 && n % (style.parts * size * style.unit) != 0) {
      const std::string units = (style.unit_name.empty() ? "units" : style.unit_name) + " of " +
                                std::to_string(style.unit) + " elements";
      if (n % (style.parts * style.unit) != 0)
        throw ConfigError(where + ": its " + extent + " is not a whole number of " + units +
                          ": a slice would cut one apart");
      throw ConfigError(where + ": its " + extent + " is " + parts +
                        std::to_string(n / (style.parts * style.unit)) + " " + units +
                        ", which tp " + std::to_string(size) +
                        " would cut apart: make their number a multiple of tp");
    }
    if (style.parts < 1 || style.unit < 1 || n % (style.parts * size) != 0)
      throw ConfigError(where + ": its " + extent + " is not divisible by " + parts + "tp " +
                        std::to_string(size) + ": make it a multiple of " +
                        std::to_string(std::max<int64_t>(style.parts, 1) * size));
    shards.push_back(std::move(shard));
  }
  std::vector<std::string> done;
  for (size_t i = 0; i < matches.size(); ++i) {
    done.push_back(matches[i].name);
    if (size == 1) continue;
    if (auto* e = matches[i].module->as<EmbeddingImpl>()) {
      e->set_parallel(std::move(shards[i]));
    } else {
      matches[i].module->as<LinearImpl>()->set_parallel(std::move(shards[i]));
    }
  }
  return done;
}

namespace {
// `model` and every module in it (named_modules can include the model itself only when a
// shared_ptr owns it).
std::vector<torch::nn::Module*> all_modules(torch::nn::Module& model) {
  std::vector<torch::nn::Module*> out = {&model};
  for (const auto& m : model.modules(/*include_self=*/false)) out.push_back(m.get());
  return out;
}
}  // namespace

void unparallelize(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (torch::nn::Module* m : all_modules(model)) {
    if (auto* l = m->as<LinearImpl>(); l != nullptr && l->parallel()) {
      const TensorParallelShard p = *l->parallel();
      replace_data(l->weight, p.gather(l->weight.detach(), p.dim));
      if (l->bias.defined() && p.dim == 0) replace_data(l->bias, p.gather(l->bias.detach(), 0));
      l->clear_parallel();
    } else if (auto* e = m->as<EmbeddingImpl>(); e != nullptr && e->parallel()) {
      replace_data(e->weight, e->parallel()->gather(e->weight.detach(), 0));
      e->clear_parallel();
    }
  }
}

bool is_split_parameter(torch::nn::Module& model, const torch::Tensor& tensor) {
  for (torch::nn::Module* m : all_modules(model)) {
    if (auto* l = m->as<LinearImpl>(); l != nullptr && l->parallel()) {
      if (l->weight.is_same(tensor)) return true;
      if (l->bias.defined() && l->bias.is_same(tensor)) return l->parallel()->dim == 0;
    } else if (auto* e = m->as<EmbeddingImpl>(); e != nullptr && e->parallel()) {
      if (e->weight.is_same(tensor)) return true;
    }
  }
  return false;
}

}  // namespace fabric::nn
