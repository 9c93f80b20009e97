#include "tools/sweep/yaml.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/core/suggest.h"

namespace fabric::sweep {
namespace {

const std::vector<std::string> kPrunerKeys = {
    "type", "metric", "mode", "min_steps", "min_epochs", "reduction_factor", "min_runs"};

}  // namespace

std::string value_text(const YAML::Node& node) {
  if (node.IsScalar()) {
    // A plain scalar keeps its spelling; a quoted one is re-emitted quoted (it may look like a
    // number or a list otherwise).
    if (node.Tag() != "!") return node.Scalar();
    YAML::Emitter out;
    out << YAML::DoubleQuoted << node.Scalar();
    return out.c_str();
  }
  YAML::Emitter out;
  out.SetSeqFormat(YAML::Flow);
  out.SetMapFormat(YAML::Flow);
  out << node;
  return out.c_str();
}

Distribution parse_distribution(const Parser& p, const YAML::Node& node, const std::string& where) {
  Distribution dist;
  if (node.IsSequence()) {
    dist.kind = "choice";
    for (const auto& value : node) dist.values.push_back(value_text(value));
  } else if (node.IsMap() && node.size() == 1) {
    const YAML::Node name = node.begin()->first, args = node.begin()->second;
    dist.kind = p.scalar(name, where);
    if (std::find(kDistributions.begin(), kDistributions.end(), dist.kind) == kDistributions.end())
      p.fail(name, where + ": unknown distribution '" + dist.kind + "'" +
                       did_you_mean(dist.kind, kDistributions) +
                       " (distributions: " + join(kDistributions) + ")");
    if (!args.IsSequence()) p.fail(args, where + ": " + dist.kind + ": expected a list");
    if (dist.kind == "choice") {
      for (const auto& value : args) dist.values.push_back(value_text(value));
    } else {
      if (args.size() != 2) p.fail(args, where + ": " + dist.kind + ": expected [low, high]");
      if (dist.kind == "int") {
        dist.low = static_cast<double>(p.integer(args[0], where, INT64_MIN));
        dist.high = static_cast<double>(p.integer(args[1], where, INT64_MIN));
      } else {
        dist.low = p.number(args[0], where);
        dist.high = p.number(args[1], where);
      }
      if (!(dist.low < dist.high))
        p.fail(args, where + ": " + dist.kind + ": low must be below high");
      if (dist.kind == "loguniform" && dist.low <= 0)
        p.fail(args, where +
                         ": loguniform: low must be above 0 (use uniform for ranges "
                         "that reach 0)");
    }
  } else {
    p.fail(node, where +
                     ": expected a distribution, e.g. {uniform: [0, 1]}, {loguniform: "
                     "[0.001, 1]}, {int: [16, 64]} or a list of choices");
  }
  if (dist.kind == "choice" && dist.values.empty())
    p.fail(node, where + ": choice: expected at least one value");
  return dist;
}

PrunerSpec parse_pruner(const Parser& p, const YAML::Node& node, bool sweep_maximizes) {
  PrunerSpec pruner;
  pruner.origin = p.at(node);
  pruner.maximize = sweep_maximizes;
  bool min_given = false;
  for (const auto& item : node) {
    const std::string key = p.scalar(item.first, "pruner key");
    const YAML::Node& v = item.second;
    const std::string where = "pruner: " + key;
    if (key == "type") {
      pruner.type = p.scalar(v, where);
      if (pruner.type != "median" && pruner.type != "asha")
        p.fail(v, where + ": '" + pruner.type + "' is not median or asha" +
                      did_you_mean(pruner.type, {"median", "asha"}));
    } else if (key == "metric") {
      pruner.metric = p.scalar(v, where);
      if (pruner.metric.empty() || pruner.metric == "step" || pruner.metric == "epoch")
        p.fail(v, where + ": name a metrics.csv column the runs log, e.g. test/accuracy");
    } else if (key == "mode") {
      const std::string mode = p.scalar(v, where);
      if (mode != "max" && mode != "min")
        p.fail(v,
               where + ": '" + mode + "' is not max or min" + did_you_mean(mode, {"max", "min"}));
      pruner.maximize = mode == "max";
    } else if (key == "min_steps" || key == "min_epochs") {
      if (min_given) p.fail(item.first, "pruner: give min_steps or min_epochs, not both");
      min_given = true;
      pruner.by_epoch = key == "min_epochs";
      pruner.min_resource = static_cast<double>(p.integer(v, where, 1));
    } else if (key == "reduction_factor") {
      pruner.reduction_factor = static_cast<int>(p.integer(v, where, 2, kMaxCount));
    } else if (key == "min_runs") {
      pruner.min_runs = static_cast<int>(p.integer(v, where, 1, kMaxCount));
    } else {
      p.fail(item.first, "unknown pruner key '" + key + "'" + did_you_mean(key, kPrunerKeys) +
                             " (keys: " + join(kPrunerKeys) + ")");
    }
  }
  if (pruner.type.empty()) p.fail(node, "pruner: type: missing; write type: median or type: asha");
  if (pruner.metric.empty())
    p.fail(node,
           "pruner: metric: missing; name the metrics.csv column the decisions use, e.g. "
           "metric: test/accuracy");
  if (pruner.type == "median" && node["reduction_factor"])
    p.fail(node["reduction_factor"], "pruner: reduction_factor: only used by type: asha");
  if (pruner.type == "asha" && node["min_runs"])
    p.fail(node["min_runs"], "pruner: min_runs: only used by type: median");
  return pruner;
}

}  // namespace fabric::sweep
