#include "tools/sweep/setup.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <vector>

#include "fabric/accelerators/cpu_info.h"
#include "fabric/config/config.h"
#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "fabric/core/suggest.h"

namespace fabric::sweep {
namespace {

namespace fs = std::filesystem;

bool executable(const fs::path& p) {
  return fs::is_regular_file(p) && access(p.c_str(), X_OK) == 0;
}

// `binary:`: a label bundled with the tool, or a path; a relative path means what it means where
// the runs start (`workdir`: the sweep file's folder or its workdir:), else from the working
// directory the sweep was started in.
fs::path find_binary(const SweepSpec& spec, const fs::path& workdir) {
  const std::string& b = spec.binary;
  std::vector<fs::path> tried;
  if (b.rfind("//", 0) == 0) {
    std::string pkg = b.substr(2), name;
    const auto colon = pkg.find(':');
    if (colon == std::string::npos) {
      name = pkg.substr(pkg.rfind('/') + 1);
    } else {
      name = pkg.substr(colon + 1);
      pkg = pkg.substr(0, colon);
    }
    if (const auto runfiles = runfiles_directory()) {
      tried.push_back(*runfiles / pkg / name);
      if (executable(tried.back())) return tried.back();
    }
    throw ConfigError(spec.binary_mark + ": binary: " + b +
                      " is not bundled with //tools:sweep (only its data deps are); give the "
                      "program's path instead, e.g. bazel-bin/" +
                      pkg + "/" + name + " after bazel build " + b);
  }
  for (const fs::path& p : {(workdir / b).lexically_normal(), absolute_from_working_directory(b)}) {
    tried.push_back(p);
    if (executable(p)) return fs::absolute(p);
  }
  throw ConfigError(spec.binary_mark + ": binary: '" + b + "' is not an executable file (tried " +
                    tried[0].string() + ", " + tried[1].string() + ")");
}

std::string find_config(const SweepSpec& spec, const fs::path& sweep_file) {
  if (spec.config.empty()) return "";
  const fs::path next_to = sweep_file.parent_path() / spec.config;
  if (fs::is_regular_file(next_to)) return fs::absolute(next_to).string();
  for (const auto& c : search_candidates(spec.config, "configs", {}))
    if (fs::is_regular_file(c)) return fs::absolute(c).string();
  return spec.config;  // the program reports where it looked
}

// A program's one-line error for an override, located in the sweep file when it names a key.
std::string locate(const SweepSpec& spec, const SweepRun* run, const std::string& message) {
  const std::string prefix = "command line: ";
  if (message.rfind(prefix, 0) != 0) return spec.file + ": " + message;
  const std::string rest = message.substr(prefix.size());
  const std::string key = rest.substr(0, rest.find(':'));
  if (run != nullptr) {
    for (size_t i = 0; i < run->overrides.size(); ++i)
      if (run->overrides[i].first == key) return run->value_origin[i] + ": " + rest;
  }
  auto it = spec.key_origin.find(key);
  return (it != spec.key_origin.end() ? it->second : spec.file) + ": " + rest;
}

}  // namespace

std::vector<std::string> visible_gpus() {
  std::vector<std::string> gpus;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string s = v, item;
    for (size_t i = 0; i <= s.size(); ++i) {
      if (i == s.size() || s[i] == ',') {
        if (!item.empty()) gpus.push_back(item);
        item.clear();
      } else if (s[i] != ' ') {
        item += s[i];
      }
    }
    return gpus;
  }
  const std::regex dev("^nvidia[0-9]+$");
  std::error_code ec;
  std::vector<int> ids;
  for (const auto& e : fs::directory_iterator("/dev", ec)) {
    const std::string n = e.path().filename().string();
    if (std::regex_match(n, dev)) ids.push_back(std::stoi(n.substr(6)));
  }
  std::sort(ids.begin(), ids.end());
  for (int id : ids) gpus.push_back(std::to_string(id));
  return gpus;
}

Setup prepare(const SweepSpec& spec, const fs::path& sweep_file, RunnerOptions options) {
  // Runs start in the sweep file's folder (or its workdir:).
  const fs::path workdir =
      (fs::absolute(sweep_file).parent_path() / spec.workdir).lexically_normal();
  std::error_code ec;
  if (!fs::is_directory(workdir, ec))
    throw ConfigError((spec.workdir_mark.empty() ? spec.file : spec.workdir_mark) +
                      ": workdir: " + workdir.string() +
                      " is not a folder; runs start there (relative to the sweep file's folder)");
  options.cwd = workdir;
  options.binary = find_binary(spec, workdir);
  options.config = find_config(spec, sweep_file);
  Setup setup;
  std::vector<std::string> argv = {options.binary.string()};
  if (!options.config.empty()) argv.push_back("--config=" + options.config);
  for (const auto& [k, v] : spec.common) argv.push_back(k + "=" + v);
  argv.push_back("--print_config");
  const Captured probe = run_captured(argv, options.cwd);
  if (probe.code != 0) {
    throw ConfigError(locate(spec, nullptr, last_line(probe.output)) + " (checking " + spec.binary +
                      " --print_config, exit " + std::to_string(probe.code) + ")");
  }
  try {
    setup.resolved = config_leaves(probe.output);
  } catch (const ConfigError&) {
    throw ConfigError(spec.binary_mark + ": binary: " + spec.binary +
                      " --print_config did not print a YAML config; is it a Fabric program?");
  }
  std::vector<std::string> keys;
  for (const auto& [k, v] : setup.resolved) keys.push_back(k);
  if (!setup.resolved.count("logging.run_dir"))
    throw ConfigError(spec.binary_mark + ": binary: " + spec.binary +
                      " has no logging.run_dir key; sweeps run Fabric programs built on "
                      "fabric::training_schema()");
  for (const auto& k : spec.swept_keys) {
    if (!setup.resolved.count(k))
      throw ConfigError(spec.key_origin.at(k) + ": '" + k + "' is not a key of " + spec.binary +
                        did_you_mean(k, keys) + " (see " + spec.binary + " --help)");
  }
  if (!spec.seeds.empty() && !setup.resolved.count(spec.seed_key))
    throw ConfigError(spec.file + ": seed_key: '" + spec.seed_key + "' is not a key of " +
                      spec.binary + did_you_mean(spec.seed_key, keys));
  const bool resume_set = std::any_of(spec.common.begin(), spec.common.end(), [](const auto& kv) {
    return kv.first == "checkpoint.resume";
  });
  if (spec.resume_runs && !resume_set && setup.resolved.count("checkpoint.resume"))
    options.extra.push_back("checkpoint.resume=auto");
  setup.options = std::move(options);
  return setup;
}

void plan_devices(const SweepSpec& spec, const Setup& setup, RunnerOptions& options,
                  std::ostream& out) {
  auto acc = setup.resolved.find("fabric.accelerator");
  std::vector<std::string> gpus;
  if (acc == setup.resolved.end() || acc->second != "cpu") gpus = visible_gpus();
  const std::optional<int> requested =
      options.parallel > 0 ? std::optional<int>(options.parallel) : spec.parallel;
  options.gpu_slots.clear();
  options.cpus_per_run = 0;
  // Parallel runs split the CPUs this sweep may use; each run's ranks split its share again
  // (fabric.num_threads auto reads FABRIC_CPUS). An OMP_NUM_THREADS the user set wins.
  auto split_cpus = [&] {
    if (options.parallel <= 1 || std::getenv("OMP_NUM_THREADS") != nullptr) return;
    int64_t cpus = query_cpu_info().usable();
    if (const char* budget = std::getenv("FABRIC_CPUS"))
      cpus = parse_cpu_count(budget).value_or(cpus);
    if (cpus > 0) options.cpus_per_run = std::max<int64_t>(1, cpus / options.parallel);
  };
  if (gpus.empty()) {
    options.parallel = requested.value_or(1);
    split_cpus();
    return;
  }
  const int slots = static_cast<int>(gpus.size()) / spec.devices_per_run;
  if (slots == 0)
    throw ConfigError(spec.file + ": devices_per_run: " + std::to_string(spec.devices_per_run) +
                      " but only " + std::to_string(gpus.size()) + " GPU(s) are visible");
  options.parallel = requested.value_or(slots);
  if (options.parallel > slots) {
    out << "sweep: parallel " << options.parallel << " capped to " << slots << " (" << gpus.size()
        << " GPU(s), " << spec.devices_per_run << " per run)" << std::endl;
    options.parallel = slots;
  }
  for (int s = 0; s < options.parallel; ++s) {
    std::vector<std::string> ids(gpus.begin() + s * spec.devices_per_run,
                                 gpus.begin() + (s + 1) * spec.devices_per_run);
    options.gpu_slots.push_back(join(ids, ","));
  }
  split_cpus();
}

std::vector<const SweepRun*> runs_to_check(const std::vector<const SweepRun*>& runs) {
  std::vector<bool> chosen(runs.size(), false);
  std::set<std::vector<std::string>> key_sets;
  std::set<std::pair<std::string, std::string>> values;
  // key → (run index, value) of its smallest and largest number
  std::map<std::string, std::pair<size_t, double>> low, high;
  for (size_t i = 0; i < runs.size(); ++i) {
    std::vector<std::string> keys;
    for (const auto& [key, text] : runs[i]->overrides) {
      keys.push_back(key);
      char* end = nullptr;
      const double x = std::strtod(text.c_str(), &end);
      const bool real = !text.empty() && end == text.c_str() + text.size() &&
                        text.find_first_of(".eE") != std::string::npos && std::isfinite(x);
      if (!real) {
        if (values.emplace(key, text).second) chosen[i] = true;
        continue;
      }
      if (!low.count(key) || x < low[key].second) low[key] = {i, x};
      if (!high.count(key) || x > high[key].second) high[key] = {i, x};
    }
    if (key_sets.insert(keys).second) chosen[i] = true;
  }
  for (const auto* ends : {&low, &high})
    for (const auto& [key, at] : *ends) chosen[at.first] = true;
  std::vector<const SweepRun*> out;
  for (size_t i = 0; i < runs.size(); ++i)
    if (chosen[i]) out.push_back(runs[i]);
  return out;
}

void preflight(const SweepSpec& spec, SweepState& state, const RunnerOptions& options,
               std::ostream* progress) {
  std::vector<const SweepRun*> runs;
  for (const SweepRun& run : spec.runs)
    if (!has_result(state[run.id].status)) runs.push_back(&run);
  const std::vector<const SweepRun*> pending = runs_to_check(runs);
  // Many checks take a while (a program's start-up each): say so, then every 5 seconds.
  using Clock = std::chrono::steady_clock;
  const bool tell = progress != nullptr && runs.size() > 20;
  if (tell)
    *progress << "sweep: checking the configs of " << runs.size() << " runs (" << spec.binary
              << " --print_config for " << pending.size()
              << " of them: each distinct set of keys and non-real value, each real value's "
                 "smallest and largest)"
              << std::endl;
  auto next_line = Clock::now() + std::chrono::seconds(5);
  for (size_t i = 0; i < pending.size(); ++i) {
    auto argv = run_command_line(spec, *pending[i], options);
    argv.push_back("--print_config");
    const Captured c = run_captured(argv, options.cwd);
    if (c.code != 0)
      throw ConfigError(locate(spec, pending[i], last_line(c.output)) + " (run " + pending[i]->id +
                        ")");
    if (tell && Clock::now() >= next_line) {
      *progress << "sweep: checked " << i + 1 << " of " << pending.size() << " run configs"
                << std::endl;
      next_line = Clock::now() + std::chrono::seconds(5);
    }
  }
}

}  // namespace fabric::sweep
