#include "fabric/checkpoint/optimizer_state.h"

#include <torch/optim.h>

#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/core/scaled_step.h"

namespace fabric {
namespace {

using torch::optim::OptimizerOptions;
using torch::optim::OptimizerParamState;
using Dict = c10::impl::GenericDict;

struct OptionField {
  std::string key;
  std::function<c10::IValue(const OptimizerOptions&)> get;
  std::function<void(OptimizerOptions&, const c10::IValue&)> set;  // throws on a wrong type
};
struct TensorField {
  std::string key;
  std::function<torch::Tensor(const OptimizerParamState&)> get;
  std::function<void(OptimizerParamState&, torch::Tensor)> set;
};

// What differs between the supported optimizer types.
struct Kind {
  std::string type;
  std::function<bool(const torch::optim::Optimizer&)> is;
  std::vector<OptionField> options;
  std::vector<TensorField> tensors;
  std::function<std::unique_ptr<OptimizerParamState>()> make_state;
  std::function<int64_t(const OptimizerParamState&)> get_step;  // null: no step counter
  std::function<void(OptimizerParamState&, int64_t)> set_step;
};

double as_double(const c10::IValue& v) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  throw std::runtime_error("is not a number");
}
bool as_bool(const c10::IValue& v) {
  if (!v.isBool()) throw std::runtime_error("is not a bool");
  return v.toBool();
}
std::tuple<double, double> as_pair(const c10::IValue& v) {
  std::vector<c10::IValue> items;
  if (v.isTuple()) items = v.toTupleRef().elements().vec();
  if (v.isList()) items = v.toList().vec();
  if (items.size() != 2) throw std::runtime_error("is not a pair of numbers");
  return {as_double(items[0]), as_double(items[1])};
}

// Option `f` of options type O, read back with `as` (as_double, as_bool).
#define FABRIC_OPTION(O, f, as)                                                            \
  OptionField {                                                                            \
#f, [](const OptimizerOptions& o) { return c10::IValue(static_cast<const O&>(o).f()); }, \
        [](OptimizerOptions& o, const c10::IValue& v) { static_cast<O&>(o).f(as(v)); } \
  }
#define FABRIC_DOUBLE(O, f) FABRIC_OPTION(O, f, as_double)
#define FABRIC_BOOL(O, f) FABRIC_OPTION(O, f, as_bool)
#define FABRIC_BETAS(O)                                                                         \
  OptionField {                                                                                 \
    "betas",                                                                                    \
        [](const OptimizerOptions& o) {                                                         \
          const auto& [b1, b2] = static_cast<const O&>(o).betas();                              \
          return c10::IValue(c10::ivalue::Tuple::create({c10::IValue(b1), c10::IValue(b2)}));   \
        },                                                                                      \
        [](OptimizerOptions& o, const c10::IValue& v) { static_cast<O&>(o).betas(as_pair(v)); } \
  }
#define FABRIC_TENSOR(S, f)                                                                \
  TensorField {                                                                            \
#f, [](const OptimizerParamState& s) { return static_cast<const S&>(s).f(); },           \
        [](OptimizerParamState& s, torch::Tensor t) { static_cast<S&>(s).f(std::move(t)); } \
  }

template <typename Optimizer, typename State>
Kind kind(std::string type, std::vector<OptionField> options, std::vector<TensorField> tensors,
          bool has_step) {
  Kind k{std::move(type),
         [](const torch::optim::Optimizer& o) { return dynamic_cast<const Optimizer*>(&o); },
         std::move(options),
         std::move(tensors),
         [] { return std::make_unique<State>(); },
         nullptr,
         nullptr};
  if constexpr (!std::is_same_v<State, torch::optim::SGDParamState>) {
    if (has_step) {
      k.get_step = [](const OptimizerParamState& s) { return static_cast<const State&>(s).step(); };
      k.set_step = [](OptimizerParamState& s, int64_t v) { static_cast<State&>(s).step(v); };
    }
  }
  return k;
}

const std::vector<Kind>& kinds() {
  using namespace torch::optim;  // NOLINT
  static const std::vector<Kind> all = {
      kind<SGD, SGDParamState>(
          "SGD",
          {FABRIC_DOUBLE(SGDOptions, lr), FABRIC_DOUBLE(SGDOptions, momentum),
           FABRIC_DOUBLE(SGDOptions, dampening), FABRIC_DOUBLE(SGDOptions, weight_decay),
           FABRIC_BOOL(SGDOptions, nesterov)},
          {FABRIC_TENSOR(SGDParamState, momentum_buffer)}, false),
      kind<AdamW, AdamWParamState>(
          "AdamW",
          {FABRIC_DOUBLE(AdamWOptions, lr), FABRIC_BETAS(AdamWOptions),
           FABRIC_DOUBLE(AdamWOptions, eps), FABRIC_DOUBLE(AdamWOptions, weight_decay),
           FABRIC_BOOL(AdamWOptions, amsgrad)},
          {FABRIC_TENSOR(AdamWParamState, exp_avg), FABRIC_TENSOR(AdamWParamState, exp_avg_sq),
           FABRIC_TENSOR(AdamWParamState, max_exp_avg_sq)},
          true),
      kind<Adam, AdamParamState>(
          "Adam",
          {FABRIC_DOUBLE(AdamOptions, lr), FABRIC_BETAS(AdamOptions),
           FABRIC_DOUBLE(AdamOptions, eps), FABRIC_DOUBLE(AdamOptions, weight_decay),
           FABRIC_BOOL(AdamOptions, amsgrad)},
          {FABRIC_TENSOR(AdamParamState, exp_avg), FABRIC_TENSOR(AdamParamState, exp_avg_sq),
           FABRIC_TENSOR(AdamParamState, max_exp_avg_sq)},
          true),
      kind<RMSprop, RMSpropParamState>(
          "RMSprop",
          {FABRIC_DOUBLE(RMSpropOptions, lr), FABRIC_DOUBLE(RMSpropOptions, alpha),
           FABRIC_DOUBLE(RMSpropOptions, eps), FABRIC_DOUBLE(RMSpropOptions, weight_decay),
           FABRIC_DOUBLE(RMSpropOptions, momentum), FABRIC_BOOL(RMSpropOptions, centered)},
          {FABRIC_TENSOR(RMSpropParamState, square_avg),
           FABRIC_TENSOR(RMSpropParamState, momentum_buffer),
           FABRIC_TENSOR(RMSpropParamState, grad_avg)},
          true),
      kind<Adagrad, AdagradParamState>(
          "Adagrad",
          {FABRIC_DOUBLE(AdagradOptions, lr), FABRIC_DOUBLE(AdagradOptions, lr_decay),
           FABRIC_DOUBLE(AdagradOptions, weight_decay),
           FABRIC_DOUBLE(AdagradOptions, initial_accumulator_value),
           FABRIC_DOUBLE(AdagradOptions, eps)},
          {FABRIC_TENSOR(AdagradParamState, sum)}, true),
  };
  return all;
}
#undef FABRIC_OPTION
#undef FABRIC_DOUBLE
#undef FABRIC_BOOL
#undef FABRIC_BETAS
#undef FABRIC_TENSOR

const Kind& kind_of(const torch::optim::Optimizer& optimizer) {
  for (const auto& k : kinds())  // AdamW before Adam: neither derives from the other, order is safe
    if (k.is(optimizer)) return k;
  throw Error(std::string("cannot checkpoint an optimizer of type ") + typeid(optimizer).name() +
              " (supported: SGD, Adam, AdamW, RMSprop, Adagrad)");
}

std::string shape(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

c10::IValue get(const Dict& dict, const std::string& key, const std::string& where) {
  auto it = dict.find(key);
  if (it == dict.end()) throw std::runtime_error(where + " has no \"" + key + "\"");
  return it->value();
}

}  // namespace

c10::IValue optimizer_state(const torch::optim::Optimizer& optimizer) {
  const Kind& k = kind_of(optimizer);
  // Counters a fused optimizer keeps on the device are part of the state's value.
  if (auto* scaled = dynamic_cast<const ScaledStep*>(&optimizer))
    const_cast<ScaledStep*>(scaled)->sync_state();
  Dict state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    Dict g(c10::StringType::get(), c10::AnyType::get());
    for (const auto& field : k.options) g.insert(field.key, field.get(group.options()));
    c10::impl::GenericList ids(c10::AnyType::get());  // typed lists pickle as code calls
    for (const auto& p : group.params()) {
      ids.push_back(index);
      auto it = optimizer.state().find(p.unsafeGetTensorImpl());
      if (it != optimizer.state().end()) {
        Dict s(c10::StringType::get(), c10::AnyType::get());
        if (k.get_step) s.insert("step", k.get_step(*it->second));
        for (const auto& field : k.tensors)
          if (auto t = field.get(*it->second); t.defined()) s.insert(field.key, t.detach());
        state.insert(index, s);
      }
      ++index;
    }
    g.insert("params", ids);
    groups.push_back(g);
  }
  Dict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("type", k.type);
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

std::function<void()> keep_option_fields(torch::optim::Optimizer& optimizer,
                                         const std::set<std::string>& fields,
                                         std::set<std::string>* kept_fields) {
  std::vector<const OptionField*> chosen;  // the fields this type has
  for (const auto& field : kind_of(optimizer).options)
    if (fields.count(field.key)) {
      chosen.push_back(&field);
      if (kept_fields) kept_fields->insert(field.key);
    }
  std::vector<std::vector<std::pair<const OptionField*, c10::IValue>>> kept;
  for (const auto& group : optimizer.param_groups()) {
    kept.emplace_back();
    for (const OptionField* field : chosen)
      kept.back().emplace_back(field, field->get(group.options()));
  }
  return [&optimizer, kept = std::move(kept)] {
    auto& live = optimizer.param_groups();
    for (size_t g = 0; g < live.size() && g < kept.size(); ++g)
      for (const auto& [field, value] : kept[g]) field->set(live[g].options(), value);
  };
}

std::function<void()> prepare_optimizer_state(torch::optim::Optimizer& optimizer,
                                              const c10::IValue& value, const std::string& source) {
  const Kind& k = kind_of(optimizer);
  auto fail = [&](const std::string& why) -> std::function<void()> {
    throw Error(source + ": does not match the optimizer: " + why);
  };
  try {
    if (!value.isGenericDict()) return fail("not an optimizer state");
    const Dict dict = value.toGenericDict();
    const std::string type = get(dict, "type", "the state").toStringRef();
    if (type != k.type) return fail("saved from " + type + ", the optimizer is " + k.type);
    const auto groups = get(dict, "param_groups", "the state").toList();
    auto& live = optimizer.param_groups();
    if (groups.size() != live.size())
      return fail(std::to_string(groups.size()) + " parameter groups saved, the optimizer has " +
                  std::to_string(live.size()));
    std::vector<torch::Tensor> params;  // by global index
    std::vector<std::unique_ptr<OptimizerOptions>> options;
    for (size_t g = 0; g < live.size(); ++g) {
      const Dict saved = groups.get(g).toGenericDict();
      const std::string where = "parameter group " + std::to_string(g);
      const auto ids = get(saved, "params", where).toList();
      if (ids.size() != live[g].params().size())
        return fail(where + " has " + std::to_string(ids.size()) + " parameters saved, " +
                    std::to_string(live[g].params().size()) + " in the optimizer");
      auto o = live[g].options().clone();
      for (const auto& field : k.options) {
        try {
          field.set(*o, get(saved, field.key, where));
        } catch (const std::runtime_error& e) {
          return fail(where + " option " + field.key + ": " + e.what());
        }
      }
      options.push_back(std::move(o));
      for (const auto& p : live[g].params()) params.push_back(p);
    }
    std::vector<std::pair<torch::Tensor, std::unique_ptr<OptimizerParamState>>> states;
    for (const auto& entry : get(dict, "state", "the state").toGenericDict()) {
      const int64_t i = entry.key().toInt();
      if (i < 0 || i >= static_cast<int64_t>(params.size()))
        return fail("state for parameter " + std::to_string(i) + ", the optimizer has " +
                    std::to_string(params.size()));
      const Dict saved = entry.value().toGenericDict();
      auto s = k.make_state();
      if (k.set_step) k.set_step(*s, get(saved, "step", "state " + std::to_string(i)).toInt());
      for (const auto& field : k.tensors) {
        auto it = saved.find(field.key);
        if (it == saved.end()) continue;
        const torch::Tensor t = it->value().toTensor();
        if (!t.sizes().equals(params[i].sizes()))
          return fail(field.key + " of parameter " + std::to_string(i) + " has shape " + shape(t) +
                      ", the parameter " + shape(params[i]));
        // In the parameter's memory format (files hold contiguous tensors): fused kernels pass
        // over parameter, gradient and state as flat arrays, so their layouts must match. A
        // tensor read for this already has it (a sharded checkpoint's piece): taken as it is.
        // Floating state takes the parameter's dtype, as torch.optim's load_state_dict casts
        // it: a run resumed at another fabric.precision (32-true -> bf16-true) steps on.
        const torch::ScalarType dtype = t.is_floating_point() && params[i].is_floating_point()
                                            ? params[i].scalar_type()
                                            : t.scalar_type();
        if (t.scalar_type() == dtype && t.strides().equals(params[i].strides()) &&
            t.device() == params[i].device() && t.is_non_overlapping_and_dense()) {
          field.set(*s, t.detach());
          continue;
        }
        torch::Tensor restored =
            at::empty_like(params[i], params[i].options().dtype(dtype), at::MemoryFormat::Preserve);
        field.set(*s, restored.copy_(t));
      }
      states.emplace_back(params[i], std::move(s));
    }
    auto shared = std::make_shared<decltype(states)>(std::move(states));
    auto shared_options = std::make_shared<decltype(options)>(std::move(options));
    return [&optimizer, shared, shared_options] {
      optimizer.state().clear();
      for (auto& [p, s] : *shared) optimizer.state()[p.unsafeGetTensorImpl()] = std::move(s);
      auto& live = optimizer.param_groups();
      for (size_t g = 0; g < live.size(); ++g) live[g].set_options(std::move((*shared_options)[g]));
      if (auto* scaled = dynamic_cast<ScaledStep*>(&optimizer)) scaled->state_loaded();
    };
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // wrong IValue types: a file that is not ours
    std::string why = e.what();
    return fail("malformed optimizer state (" + why.substr(0, why.find('\n')) + ")");
  }
}

}  // namespace fabric
