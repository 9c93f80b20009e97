#include "tools/sweep/changes.h"

#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "fabric/core/error.h"
#include "fabric/core/hash.h"
#include "fabric/core/paths.h"

namespace fabric::sweep {
namespace {

namespace fs = std::filesystem;

// The arguments compared between invocations: the command line without the program and without
// logging.run_dir (the sweep directory's place, not the run's settings).
std::vector<std::string> compared_arguments(const std::vector<std::string>& argv, size_t from) {
  std::vector<std::string> out;
  for (size_t i = from; i < argv.size(); ++i)
    if (argv[i].rfind("logging.run_dir=", 0) != 0) out.push_back(argv[i]);
  return out;
}

}  // namespace

std::string config_text_hash(const std::string& config) {
  if (config.empty()) return "";
  // The file and the base: files it builds on (fabric/config: a base relative to the file's
  // folder, else searched as --config is), each file's text in turn; at most 16 deep.
  uint64_t h = fnv1a64("");
  fs::path file = config;
  for (int depth = 0; depth < 16 && !file.empty(); ++depth) {
    std::ifstream in(file, std::ios::binary);
    if (!in) break;
    std::ostringstream text;
    text << in.rdbuf();
    h = fnv1a64(text.str(), h);
    std::string base;
    try {
      const YAML::Node root = YAML::Load(text.str());
      if (root.IsMap() && root["base"] && root["base"].IsScalar()) base = root["base"].Scalar();
    } catch (const YAML::Exception&) {
    }
    const fs::path next = file.parent_path() / base;
    file.clear();
    if (base.empty()) break;
    std::error_code ec;
    if (fs::is_regular_file(next, ec)) {
      file = next;
    } else {
      for (const auto& c : search_candidates(base, "configs", {}))
        if (fs::is_regular_file(c, ec)) {
          file = c;
          break;
        }
    }
  }
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::vector<std::string> check_changed_runs(const SweepSpec& spec, SweepState& state,
                                            const RunnerOptions& options, bool rerun_changed) {
  std::vector<std::string> changed;
  std::string first;  // the error line of the first changed run
  for (const SweepRun& run : spec.runs) {
    auto it = state.runs().find(run.id);
    if (it == state.runs().end() || !has_result(it->second.status) || it->second.command.empty())
      continue;
    const RunRecord& rec = it->second;
    const auto then = compared_arguments(rec.command, 0);
    const auto now = compared_arguments(run_command_line(spec, run, options), 1);
    std::string at, what;
    size_t i = 0;
    while (i < then.size() && i < now.size() && then[i] == now[i]) ++i;
    if (i < then.size() || i < now.size()) {
      const std::string& arg = i < now.size() ? now[i] : then[i];
      const std::string key =
          arg.rfind("--config=", 0) == 0 ? "config" : arg.substr(0, arg.find('='));
      auto origin = spec.key_origin.find(key);
      at = (origin != spec.key_origin.end() ? origin->second
            : key == "config"               ? spec.file
                                            : run.origin) +
           ": " + key + ": run " + run.id + " has a result from another command line: ";
      if (i < then.size() && i < now.size())
        what = "it ran with '" + then[i] + "', now '" + now[i] + "'";
      else if (i < now.size())
        what = "'" + now[i] + "' is new";
      else
        what = "'" + then[i] + "' is no longer given";
    } else if (rec.config_hash != options.config_hash && !rec.config_hash.empty()) {
      at = spec.file + ": config: run " + run.id + " has a result from another config: ";
      what = options.config + " changed since it ran";
    } else {
      continue;
    }
    changed.push_back(run.id);
    if (first.empty()) first = at + what;
  }
  if (changed.empty()) return changed;
  if (rerun_changed && spec.search == "optuna")
    throw ConfigError(spec.search_origin + ": search: optuna: --rerun_changed cannot run " +
                      std::to_string(changed.size()) +
                      " finished trial(s) again (a study takes one result per trial; first: " +
                      first + "); give --dir= another folder for a new study");
  if (!rerun_changed) {
    const std::string more =
        changed.size() > 1 ? " (and " + std::to_string(changed.size() - 1) + " more run(s))" : "";
    throw ConfigError(first + more +
                      "; run with --rerun_changed to run the changed runs again, or give --dir= "
                      "another folder to keep these results apart");
  }
  for (const auto& id : changed) {
    RunRecord& rec = state[id];
    rec.status = RunStatus::kPending;
    rec.summary = nlohmann::json();
    rec.reason.clear();
    rec.exit_code = 0;
    rec.reports.clear();
    rec.rung = -1;
  }
  return changed;
}

}  // namespace fabric::sweep
