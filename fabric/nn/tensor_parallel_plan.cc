// Plans applied to a model: parallelize() (checks first, then splits), unparallelize() and
// is_split_parameter(). The layers and collectives they set up are in tensor_parallel.cc.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "fabric/core/error.h"
#include "fabric/nn/empty_init.h"
#include "fabric/nn/frozen_weight.h"
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

namespace {

using Modules = torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>;

// The kinds of layer a style splits, and LibTorch's twins of them.
bool splits(const TensorParallelStyle& style, const torch::nn::Module& m) {
  if (style.kind == TensorParallelStyle::Kind::kVocab) return m.as<EmbeddingImpl>() != nullptr;
  return m.as<LinearImpl>() != nullptr;
}
bool layer_of_kind(const TensorParallelStyle& style, const torch::nn::Module& m) {
  if (style.kind == TensorParallelStyle::Kind::kVocab)
    return m.as<EmbeddingImpl>() != nullptr || m.as<torch::nn::EmbeddingImpl>() != nullptr;
  return m.as<LinearImpl>() != nullptr || m.as<torch::nn::LinearImpl>() != nullptr;
}
std::string kind_name(const TensorParallelStyle& style) {
  return style.kind == TensorParallelStyle::Kind::kVocab ? "Embedding" : "Linear";
}

// "TensorParallelStyle::column(3)": the style as a plan writes it.
std::string style_expression(const TensorParallelStyle& style) {
  const std::string name = style.name();
  return "TensorParallelStyle::" + (name.back() == ')' ? name : name + "()");
}

// A module name as a rule would write it for every block: numbered components become '*'
// ("blocks.3.attn.qkv" → "blocks.*.attn.qkv").
std::string as_pattern(const std::string& name) {
  std::string out, component;
  auto flush = [&] {
    const bool number =
        !component.empty() && std::all_of(component.begin(), component.end(),
                                          [](char c) { return c >= '0' && c <= '9'; });
    out += number ? "*" : component;
    component.clear();
  };
  for (char c : name) {
    if (c == '.') {
      flush();
      out += '.';
    } else {
      component += c;
    }
  }
  flush();
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The distinct patterns of `names`, closest to `rule` first (ties in the model's order).
std::vector<std::string> closest_patterns(const std::vector<std::string>& names,
                                          const std::string& rule) {
  std::vector<std::string> patterns;
  for (const std::string& n : names) {
    const std::string p = as_pattern(n);
    if (std::find(patterns.begin(), patterns.end(), p) == patterns.end()) patterns.push_back(p);
  }
  std::stable_sort(patterns.begin(), patterns.end(),
                   [&](const std::string& a, const std::string& b) {
                     return edit_distance(a, rule) < edit_distance(b, rule);
                   });
  return patterns;
}

// "'a', 'b', 'c' (and 2 more)": at most `most` of them.
std::string quoted_list(const std::vector<std::string>& items, size_t most = 4) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < most; ++i) out += (i ? ", '" : "'") + items[i] + "'";
  if (items.size() > most) out += " (and " + std::to_string(items.size() - most) + " more)";
  return out;
}

// The names (relative to `prefix`) of the layers of `style`'s kind in `modules` under `prefix`.
std::vector<std::string> layers_of_kind(const Modules& modules, const TensorParallelStyle& style,
                                        const std::string& prefix = "") {
  std::vector<std::string> out;
  for (const auto& item : modules) {
    if (!layer_of_kind(style, *item.value())) continue;
    if (prefix.empty()) {
      out.push_back(item.key());
    } else if (item.key().rfind(prefix + ".", 0) == 0) {
      out.push_back(item.key().substr(prefix.size() + 1));
    }
  }
  return out;
}

// Why rule `r` matches nothing, with the model's own names to use instead.
std::string matches_nothing(const Modules& modules, const std::string& rule,
                            const TensorParallelStyle& style) {
  const std::string head = "tensor parallel plan rule '" + rule + "' (" + style.name() +
                           ") matches no module of the model";
  const std::string star = " ('*' matches one name component)";
  std::vector<std::string> layers = closest_patterns(layers_of_kind(modules, style), rule);
  if (!layers.empty())
    return head + "; its " + kind_name(style) + " layers, closest first: " + quoted_list(layers) +
           "; point the rule at one, e.g. {\"" + layers.front() + "\", " + style_expression(style) +
           "}" + star;
  const std::vector<std::string> names = closest_patterns(modules.keys(), rule);
  return head + " and the model has no " + kind_name(style) +
         " layer; its modules, closest first: " +
         (names.empty() ? std::string("(none)") : quoted_list(names)) + star;
}

// Why `m` (named `name`, matched by rule `rule`) cannot be split by `style`, and the fix.
std::string cannot_split(const Modules& modules, const std::string& where, const std::string& rule,
                         const std::string& name, const torch::nn::Module& m,
                         const TensorParallelStyle& style) {
  const bool vocab = style.kind == TensorParallelStyle::Kind::kVocab;
  const std::string local =
      name.substr(name.rfind('.') == std::string::npos ? 0 : name.rfind('.') + 1);
  if (const auto* l = m.as<torch::nn::LinearImpl>(); l != nullptr && !vocab) {
    const auto& o = l->options;
    const std::string args =
        std::to_string(o.in_features()) + ", " + std::to_string(o.out_features());
    return where + ": the module is a torch::nn::Linear, which no plan can split; build it as " +
           "fabric::nn::Linear, its drop-in (same options, parameter names and initialization), " +
           "e.g. register_module(\"" + local + "\", fabric::nn::Linear(" +
           (o.bias() ? args : "torch::nn::LinearOptions(" + args + ").bias(false)") + "))";
  }
  if (const auto* e = m.as<torch::nn::EmbeddingImpl>(); e != nullptr && vocab) {
    const auto& o = e->options;
    return where + ": the module is a torch::nn::Embedding, which no plan can split; build it as " +
           "fabric::nn::Embedding, its drop-in (same options, parameter names and " +
           "initialization), e.g. register_module(\"" + local + "\", fabric::nn::Embedding(" +
           std::to_string(o.num_embeddings()) + ", " + std::to_string(o.embedding_dim()) + "))";
  }
  if (m.as<LinearImpl>() != nullptr || m.as<EmbeddingImpl>() != nullptr ||
      m.as<torch::nn::LinearImpl>() != nullptr || m.as<torch::nn::EmbeddingImpl>() != nullptr) {
    const bool linear = m.as<LinearImpl>() != nullptr || m.as<torch::nn::LinearImpl>() != nullptr;
    return where + ": the module is a" + (linear ? " Linear" : "n Embedding") + ", and " +
           style.name() + " splits " + (vocab ? "an Embedding" : "a Linear") + ": give it " +
           (linear ? "column or row" : "vocab") + " (" + style_expression(style) + " is for " +
           (vocab ? "fabric::nn::Embedding" : "fabric::nn::Linear") + ")";
  }
  const std::vector<std::string> inside = layers_of_kind(modules, style, name);
  const std::string type = m.name();
  if (!inside.empty())
    return where + ": the module is a " + type + " holding " + kind_name(style) + " layers " +
           quoted_list(inside) + "; a rule names the layer itself, e.g. {\"" + rule + "." +
           as_pattern(inside.front()) + "\", " + style_expression(style) + "}";
  const std::vector<std::string> layers = closest_patterns(layers_of_kind(modules, style), rule);
  return where + ": the module is a " + type + ", not a fabric::nn::" + kind_name(style) +
         "; a plan splits fabric::nn::Linear (column, row) and fabric::nn::Embedding (vocab) " +
         "layers only" +
         (layers.empty() ? std::string()
                         : "; the model's " + kind_name(style) +
                               " layers, closest first: " + quoted_list(layers));
}

}  // namespace

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
  const Modules modules = model.named_modules("", /*include_self=*/false);
  for (const auto& item : modules) {
    size_t r = 0;
    while (r < plan.rules.size() && !plan_pattern_matches(plan.rules[r].first, item.key())) ++r;
    if (r == plan.rules.size()) continue;
    used[r] = true;
    matches.push_back({item.key(), r, item.value()});
  }
  for (size_t r = 0; r < plan.rules.size(); ++r)
    if (!used[r])
      throw ConfigError(matches_nothing(modules, plan.rules[r].first, plan.rules[r].second));
  // The shards of this plan share one record of the sequence enter_sequence_parallel cut.
  const auto entered_sequence = std::make_shared<std::atomic<int64_t>>(-1);
  std::vector<TensorParallelShard> shards;
  for (const Match& m : matches) {
    const TensorParallelStyle style = plan.rules[m.rule].second;
    const std::string where = "tensor parallel plan rule '" + plan.rules[m.rule].first + "' (" +
                              style.name() + ") on " + m.name;
    TensorParallelShard shard(group, style, rank, size, 0, {});
    shard.sequence_parallel = plan.sequence_parallel;
    shard.module_name = m.name;
    shard.entered_sequence = entered_sequence;
    const bool vocab = style.kind == TensorParallelStyle::Kind::kVocab;
    auto* e = m.module->as<EmbeddingImpl>();
    auto* l = m.module->as<LinearImpl>();
    if (!splits(style, *m.module))
      throw ConfigError(
          cannot_split(modules, where, plan.rules[m.rule].first, m.name, *m.module, style));
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
      // A float8 weight (a stored LoRA base) travels as bytes (Gloo has no float8), its
      // per-row scale with its rows (fabric/nn/frozen_weight.h).
      const torch::Tensor w = l->weight.detach();
      const bool float8 = w.scalar_type() == torch::kFloat8_e4m3fn;
      const torch::Tensor whole =
          float8 ? p.gather(w.view(torch::kByte), p.dim).view(w.scalar_type()) : p.gather(w, p.dim);
      replace_data(l->weight, whole);
      if (l->bias.defined() && p.dim == 0) replace_data(l->bias, p.gather(l->bias.detach(), 0));
      if (const auto scales = l->named_buffers(/*recurse=*/false);
          scales.contains(kWeightScale) && p.dim == 0)
        replace_data(scales[kWeightScale], p.gather(scales[kWeightScale], 0));
      if (const auto cut = l->lora_cut()) {
        torch::Tensor t = cut->tensor;
        replace_data(t, p.gather(t.detach(), cut->along));
      }
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
      if (const auto cut = l->lora_cut(); cut && cut->tensor.is_same(tensor)) return true;
    } else if (auto* e = m->as<EmbeddingImpl>(); e != nullptr && e->parallel()) {
      if (e->weight.is_same(tensor)) return true;
    }
  }
  return false;
}

}  // namespace fabric::nn
