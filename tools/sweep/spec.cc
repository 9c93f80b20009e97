#include "tools/sweep/spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "fabric/config/yaml_load.h"
#include "fabric/core/error.h"
#include "fabric/core/hash.h"
#include "fabric/core/suggest.h"
#include "fabric/logging/run_dir.h"
#include "tools/sweep/space.h"
#include "tools/sweep/yaml.h"

namespace fabric::sweep {
namespace {

constexpr size_t kMaxIdLength = 100;

const std::vector<std::string> kTopKeys = {
    "name",     "binary",      "config",  "overrides",       "grid",   "list",
    "seeds",    "parallel",    "metric",  "devices_per_run", "mode",   "dir",
    "seed_key", "resume_runs", "search",  "trials",          "space",  "random_seed",
    "pruner",   "sampler",     "storage", "study",           "workdir"};

std::string sanitize(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '+';
    if (ok) {
      out += c;
    } else if (!out.empty() && out.back() != '_') {
      out += '_';
    }
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out.empty() ? "_" : out;
}

std::string hex_hash(const std::string& text) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(fnv1a64(text)));
  return std::string(buf, 8);
}

std::string canonical(const SweepRun& run) {
  std::string key;
  for (const auto& [k, v] : run.overrides) key += k + "=" + v + "\n";
  if (run.seed) key += "seed=" + std::to_string(*run.seed);
  return key;
}

void assign_ids(SweepSpec& spec) {
  std::map<std::string, int> count;
  for (SweepRun& run : spec.runs) {
    run.id = point_id(spec.swept_keys, run.overrides, run.seed);
    ++count[run.id];
  }
  for (SweepRun& run : spec.runs) {
    if (count[run.id] > 1 || run.id.size() > kMaxIdLength)
      run.id = run.id.substr(0, kMaxIdLength - 9) + "-" + hex_hash(canonical(run));
  }
}

}  // namespace

std::vector<std::string> SweepRun::arguments(const Overrides& common,
                                             const std::string& seed_key) const {
  std::vector<std::string> args;
  for (const auto& [k, v] : common) args.push_back(k + "=" + v);
  for (const auto& [k, v] : overrides) args.push_back(k + "=" + v);
  if (seed) args.push_back(seed_key + "=" + std::to_string(*seed));
  return args;
}

std::string point_id(const std::vector<std::string>& keys, const Overrides& values,
                     std::optional<int64_t> seed, const std::string& prefix) {
  const auto names = short_names(keys);
  std::vector<std::string> parts;
  for (const auto& key : keys) {
    for (const auto& [k, v] : values)
      if (k == key) parts.push_back(sanitize(names.at(k)) + "=" + sanitize(v));
  }
  if (seed) parts.push_back("seed=" + std::to_string(*seed));
  return prefix + (parts.empty() ? "run" : join(parts, "_"));
}

std::map<std::string, std::string> short_names(const std::vector<std::string>& keys) {
  std::map<std::string, int> uses;
  auto last = [](const std::string& k) { return k.substr(k.rfind('.') + 1); };
  for (const auto& k : keys) ++uses[last(k)];
  std::map<std::string, std::string> names;
  for (const auto& k : keys) names[k] = uses[last(k)] > 1 ? k : last(k);
  return names;
}

// The most runs one sweep file may expand to: far beyond any sweep's budget, well before its
// state and plans fill memory (2,000,000,000 trials used to spin drawing points for minutes).
constexpr int64_t kMaxRuns = 100000;

namespace {

// The top-level sections of a sweep file that are read after the scalar keys.
struct Sections {
  YAML::Node grid, list, space, search, pruner;
  std::string dir = "sweeps/{name}";
};

// Reads every top-level key into `spec` (scalars) or the returned sections; unknown keys fail.
Sections read_keys(const Parser& p, const YAML::Node& root, SweepSpec& spec) {
  Sections sections;
  for (const auto& item : root) {
    const std::string key = p.scalar(item.first, "sweep key");
    const YAML::Node& v = item.second;
    if (key == "name") {
      spec.name = p.scalar(v, key);
    } else if (key == "binary") {
      spec.binary = p.scalar(v, key);
      spec.binary_mark = p.at(v);
    } else if (key == "config") {
      spec.config = p.scalar(v, key);
    } else if (key == "overrides") {
      if (!v.IsMap()) p.fail(v, "overrides: expected a mapping of config keys to values");
      for (const auto& o : v) {
        p.check_key(o.first, "overrides");
        spec.key_origin.emplace(o.first.Scalar(), p.at(o.first));
        spec.common.emplace_back(o.first.Scalar(), value_text(o.second));
      }
    } else if (key == "grid") {
      if (!v.IsMap()) p.fail(v, "grid: expected a mapping of config keys to lists of values");
      sections.grid = v;
    } else if (key == "list") {
      if (!v.IsSequence() || v.size() == 0)
        p.fail(v, "list: expected a list of override mappings, e.g. - {optimizer.lr: 0.1}");
      sections.list = v;
    } else if (key == "seeds") {
      if (!v.IsSequence() || v.size() == 0)
        p.fail(v, "seeds: expected a list of integers, e.g. [1, 2]");
      std::set<int64_t> seen;
      for (const auto& s : v) {
        const int64_t seed = p.integer(s, "seeds", 0);
        if (!seen.insert(seed).second) p.fail(s, "seeds: " + s.Scalar() + " is listed twice");
        spec.seeds.push_back(seed);
      }
    } else if (key == "parallel") {
      if (v.IsScalar() && v.Scalar() == "auto") {
        spec.parallel.reset();
      } else {
        spec.parallel = static_cast<int>(p.integer(v, key, 1, kMaxCount));
      }
    } else if (key == "devices_per_run") {
      spec.devices_per_run = static_cast<int>(p.integer(v, key, 1, kMaxCount));
    } else if (key == "metric") {
      spec.metric = p.scalar(v, key);
    } else if (key == "mode") {
      const std::string mode = p.scalar(v, key);
      if (mode != "max" && mode != "min")
        p.fail(v, "mode: '" + mode + "' is not max or min" + did_you_mean(mode, {"max", "min"}));
      spec.maximize = mode == "max";
    } else if (key == "dir") {
      sections.dir = p.scalar(v, key);
      spec.dir_mark = p.at(v);
    } else if (key == "workdir") {
      spec.workdir = p.scalar(v, key);
      spec.workdir_mark = p.at(v);
    } else if (key == "seed_key") {
      spec.seed_key = p.scalar(v, key);
    } else if (key == "resume_runs") {
      spec.resume_runs = p.boolean(v, key);
    } else if (key == "search") {
      spec.search = p.scalar(v, key);
      sections.search = v;
      spec.search_origin = p.at(v);
      if (spec.search != "grid" && spec.search != "random" && spec.search != "optuna")
        p.fail(v, "search: '" + spec.search + "' is not grid, random or optuna" +
                      did_you_mean(spec.search, {"grid", "random", "optuna"}));
    } else if (key == "sampler") {
      spec.sampler = p.scalar(v, key);
    } else if (key == "storage") {
      spec.storage = p.scalar(v, key);
      spec.storage_mark = p.at(v);
    } else if (key == "study") {
      spec.study = p.scalar(v, key);
    } else if (key == "trials") {
      spec.trials = p.integer(v, key, 1);
      if (spec.trials > kMaxRuns)
        p.fail(v, "trials: " + v.Scalar() + " is more runs than a sweep takes (at most " +
                      std::to_string(kMaxRuns) + "); lower trials:");
    } else if (key == "random_seed") {
      spec.random_seed = static_cast<uint64_t>(p.integer(v, key, 0));
    } else if (key == "pruner") {
      if (!v.IsMap())
        p.fail(v, "pruner: expected a mapping, e.g. {type: asha, metric: test/accuracy}");
      sections.pruner = v;
    } else if (key == "space") {
      if (!v.IsMap() || v.size() == 0)
        p.fail(v,
               "space: expected a mapping of config keys to distributions, e.g. "
               "optimizer.lr: {loguniform: [0.001, 1]}");
      sections.space = v;
    } else {
      p.fail(item.first, "unknown sweep key '" + key + "'" + did_you_mean(key, kTopKeys) +
                             " (keys: " + join(kTopKeys) + ")");
    }
  }
  return sections;
}

// The keys every sweep needs, and the ones that only go with some search.
void check_keys(const Parser& p, const YAML::Node& root, const Sections& s, SweepSpec& spec) {
  const std::string& file = spec.file;
  if (spec.binary.empty())
    throw ConfigError(file +
                      ": binary: missing; name the program, e.g. binary: //examples:fashion_mnist");
  if (spec.metric.empty())
    throw ConfigError(
        file +
        ": metric: missing; name a key of the runs' summary.json, e.g. metric: test_accuracy");
  if (!root["mode"])
    throw ConfigError(file + ": mode: missing; write mode: max (higher is better) or mode: min");
  const bool drawn_search = spec.search == "random" || spec.search == "optuna";
  if (drawn_search) {
    const std::string search = "search: " + spec.search;
    if (!s.space.IsMap())
      p.fail(s.search,
             search + " needs space:, e.g. space: {optimizer.lr: {loguniform: [0.001, 1]}}");
    if (spec.trials == 0)
      p.fail(s.search, search + " needs trials: (how many points to " +
                           (spec.search == "random" ? "draw" : "ask Optuna for") +
                           "), e.g. trials: 8");
    if (s.grid.IsMap())
      p.fail(s.grid, "grid: not used by " + search +
                         "; write each key under space: as a list "
                         "(a choice among its values)");
  } else {
    for (const char* k : {"trials", "space", "random_seed"})
      if (root[k])
        p.fail(root[k],
               std::string(k) + ": only used by search: random or optuna; add search: random");
  }
  if (spec.search != "optuna") {
    for (const char* k : {"sampler", "storage", "study"})
      if (root[k]) p.fail(root[k], std::string(k) + ": only used by search: optuna");
  } else {
    for (const char* k : {"seeds", "list"})
      if (root[k])
        p.fail(root[k], std::string(k) +
                            ": not used by search: optuna (each trial is one run and "
                            "Optuna is told its metric); remove it, or use search: random");
    if (spec.study.empty()) spec.study = spec.name;
  }
  if (s.pruner.IsMap()) spec.pruner = parse_pruner(p, s.pruner, spec.maximize);
  if (!s.grid.IsMap() && !s.list.IsSequence() && !s.space.IsMap() && spec.seeds.empty())
    throw ConfigError(file + ": nothing to sweep: add grid:, list:, space: or seeds:");
  try {
    spec.dir = expand_fields(s.dir, {{"name", spec.name}});
  } catch (const Error& e) {
    throw ConfigError(p.at(root["dir"]) + ": dir: " + e.what());
  }
}

// One swept value: its key, its text and where it was written.
struct Value {
  std::string key, text, at;
};
using Point = std::vector<Value>;

// The keys grid:, space: and list: sweep: none may repeat the common overrides or the seed key;
// each is recorded once in spec.swept_keys, with where it was first written.
class SweptKeys {
 public:
  SweptKeys(const Parser& p, SweepSpec& spec) : p_(p), spec_(spec) {
    for (const auto& [k, v] : spec.common) common_.insert(k);
  }
  void claim(const YAML::Node& key_node, const std::string& where) {
    p_.check_key(key_node, where);
    const std::string k = key_node.Scalar();
    if (common_.count(k))
      p_.fail(key_node, where + ": '" + k + "' is also in overrides: keep it in one place");
    if (k == spec_.seed_key)
      p_.fail(key_node, where + ": '" + k + "' is the seed key: list the values under seeds:");
    if (std::find(spec_.swept_keys.begin(), spec_.swept_keys.end(), k) == spec_.swept_keys.end()) {
      spec_.swept_keys.push_back(k);
      spec_.key_origin.emplace(k, p_.at(key_node));
    }
  }

 private:
  const Parser& p_;
  SweepSpec& spec_;
  std::set<std::string> common_;
};

// Every point of grid: (the product of its lists), or one empty point without a grid.
std::vector<Point> grid_points(const Parser& p, const YAML::Node& grid, SweptKeys& keys) {
  std::vector<Point> points = {{}};
  if (!grid.IsMap()) return points;
  for (const auto& g : grid) {
    keys.claim(g.first, "grid");
    const std::string k = g.first.Scalar();
    if (!g.second.IsSequence() || g.second.size() == 0)
      p.fail(g.second, "grid: " + k + ": expected a list of values, e.g. [0.1, 0.2]");
    if (points.size() * g.second.size() > static_cast<size_t>(kMaxRuns))
      p.fail(g.first, "grid: with " + k + " the grid holds " + std::to_string(points.size()) +
                          " × " + std::to_string(g.second.size()) +
                          " points, more than a sweep takes (at most " + std::to_string(kMaxRuns) +
                          "); fewer values or a random search:");
    std::vector<Point> next;
    for (const auto& point : points)
      for (const auto& value : g.second) {
        auto extended = point;
        extended.push_back({k, value_text(value), p.at(value)});
        next.push_back(std::move(extended));
      }
    points = std::move(next);
  }
  return points;
}

// space:'s distributions into spec.space; returns where each was written.
std::vector<std::string> read_space(const Parser& p, const YAML::Node& space, SweptKeys& keys,
                                    SweepSpec& spec) {
  std::vector<std::string> at;
  for (const auto& d : space) {
    keys.claim(d.first, "space");
    const std::string k = d.first.Scalar();
    spec.space.emplace_back(k, parse_distribution(p, d.second, "space: " + k));
    at.push_back(p.at(d.second));
  }
  return at;
}

// search: random's points: `trials` distinct draws from spec.space.
std::vector<Point> drawn_points(const Parser& p, const YAML::Node& root, const SweepSpec& spec,
                                const std::vector<std::string>& at) {
  const auto drawn = draw_points(spec.space, spec.trials, spec.random_seed);
  if (drawn.size() < static_cast<size_t>(spec.trials))
    p.fail(root["trials"], "trials: " + std::to_string(spec.trials) +
                               " distinct points were asked for, but space: holds only " +
                               std::to_string(drawn.size()) + "; lower trials:");
  std::vector<Point> points;
  for (const auto& texts : drawn) {
    Point point;
    for (size_t i = 0; i < spec.space.size(); ++i)
      point.push_back({spec.space[i].first, texts[i], at[i]});
    points.push_back(std::move(point));
  }
  return points;
}

// list:'s entries (each a point of its own), or one empty entry without a list.
std::vector<Point> list_entries(const Parser& p, const Sections& s, SweptKeys& keys) {
  std::vector<Point> entries = {{}};
  if (!s.list.IsSequence()) return entries;
  entries.clear();
  for (const auto& entry : s.list) {
    if (!entry.IsMap() || entry.size() == 0)
      p.fail(entry,
             "list: each entry is a mapping of config keys to values, e.g. {optimizer.lr: 0.1}");
    Point values;
    for (const auto& o : entry) {
      keys.claim(o.first, "list");
      const std::string k = o.first.Scalar();
      if (s.grid.IsMap() && s.grid[k])
        p.fail(o.first, "list: '" + k + "' is also a grid key: keep it in one place");
      if (s.space.IsMap() && s.space[k])
        p.fail(o.first, "list: '" + k + "' is also a space key: keep it in one place");
      values.push_back({k, value_text(o.second), p.at(o.second)});
    }
    for (const auto& earlier : entries) {
      bool same = earlier.size() == values.size();
      for (size_t i = 0; same && i < values.size(); ++i)
        same = earlier[i].key == values[i].key && earlier[i].text == values[i].text;
      if (same) p.fail(entry, "list: this entry repeats an earlier one; remove one");
    }
    entries.push_back(std::move(values));
  }
  return entries;
}

// spec.runs: every seed × list entry × point, seeds outermost (every point gets a first result
// early); a run that appears twice is an error.
void expand_runs(const std::vector<Point>& entries, const std::vector<Point>& points,
                 SweepSpec& spec) {
  const std::string& file = spec.file;
  std::vector<std::optional<int64_t>> seeds;
  for (int64_t s : spec.seeds) seeds.emplace_back(s);
  if (seeds.empty()) seeds.emplace_back();
  if (static_cast<double>(seeds.size()) * static_cast<double>(entries.size()) *
          static_cast<double>(points.size()) >
      kMaxRuns)
    throw ConfigError(
        file + ": the sweep expands to " + std::to_string(points.size()) + " points × " +
        std::to_string(entries.size()) + " list entries × " + std::to_string(seeds.size()) +
        " seeds, more runs than a sweep takes (at most " + std::to_string(kMaxRuns) + ")");
  std::set<std::string> seen;
  for (const auto& seed : seeds)  // seeds outermost: every point gets a first result early
    for (const auto& entry : entries)
      for (const auto& point : points) {
        SweepRun run;
        run.seed = seed;
        for (const auto* part : {&entry, &point})
          for (const Value& v : *part) {
            run.overrides.emplace_back(v.key, v.text);
            run.value_origin.push_back(v.at);
            if (run.origin.empty()) run.origin = v.at;
          }
        if (run.origin.empty()) run.origin = file;
        if (!seen.insert(canonical(run)).second)
          throw ConfigError(run.origin + ": this run appears twice; remove one");
        spec.runs.push_back(std::move(run));
      }
}

}  // namespace

SweepSpec parse_sweep(const std::string& yaml, const std::string& file) {
  Parser p(file);
  const YAML::Node root = load_yaml(yaml, file);  // syntax errors and duplicate keys
  if (!root.IsMap())
    throw ConfigError(
        file + ": a sweep file is a mapping with binary:, metric:, mode: and grid: or list:");
  SweepSpec spec;
  spec.file = file;
  spec.name = std::filesystem::path(file).stem().string();
  const Sections sections = read_keys(p, root, spec);
  check_keys(p, root, sections, spec);

  SweptKeys keys(p, spec);
  std::vector<Point> points = grid_points(p, sections.grid, keys);
  if (sections.space.IsMap()) {
    const std::vector<std::string> at = read_space(p, sections.space, keys, spec);
    if (spec.search == "optuna") {  // no runs yet: the sweep asks Optuna for them one by one
      assign_ids(spec);
      return spec;
    }
    points = drawn_points(p, root, spec, at);
  }
  expand_runs(list_entries(p, sections, keys), points, spec);
  assign_ids(spec);
  return spec;
}

SweepSpec load_sweep(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot read the sweep file");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_sweep(text.str(), path);
}

}  // namespace fabric::sweep
