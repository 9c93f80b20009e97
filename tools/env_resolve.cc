#include "tools/env_resolve.h"

#include "fabric/core/error.h"
#include "tools/report_table.h"

namespace fabric::tools {
namespace {

const std::vector<std::string> kPrecisions = {"32-true",    "64-true", "16-mixed",
                                              "bf16-mixed", "16-true", "bf16-true"};

Config load(const std::string& file, const std::vector<std::string>& overrides) {
  return file.empty() ? Config::defaults(training_schema(), overrides)
                      : Config::load(file, overrides, training_schema());
}

// "command line: fabric.precision: 16-true needs ..." → "16-true needs ...".
std::string reason(const std::string& message) {
  const std::string key = "fabric.precision: ";
  const auto pos = message.find(key);
  return pos == std::string::npos ? message : message.substr(pos + key.size());
}

}  // namespace

FabricResolution resolve_here(const std::string& config_file,
                              const std::vector<std::string>& overrides,
                              const MachineFacts& facts) {
  FabricResolution r;
  if (!config_file.empty()) r.config = config_file;
  const Config config = load(config_file, overrides);
  try {
    const ResolvedSetup s = resolve_setup(config, facts);
    r.environment = s.environment->name();
    r.external_launcher = s.environment->creates_processes_externally();
    r.world_size = s.environment->world_size();
    r.global_rank = s.environment->global_rank();
    r.local_rank = s.environment->local_rank();
    r.node_rank = s.environment->node_rank();
    r.accelerator = c10::DeviceTypeName(s.accelerator, /*lower_case=*/true);
    for (const auto& d : s.devices) r.devices.push_back(d.str());
    r.device = s.device.str();
    r.strategy = strategy_name(s.strategy);
    r.precision = to_string(s.precision);
    r.threads = s.num_threads;
    r.threads_reason = s.threads_reason;
    r.warnings = s.warnings;
  } catch (const Error& e) {
    r.error = e.what();
  }
  const std::string emulated = bf16_emulated_because(facts);
  r.cpu_bf16 =
      emulated.empty() ? "native (" + facts.cpu.bf16_flags + ")" : "emulated (" + emulated + ")";
  for (const auto& mode : kPrecisions) {
    auto with_mode = overrides;
    with_mode.push_back("fabric.precision=" + mode);
    try {
      const ResolvedSetup s = resolve_setup(load(config_file, with_mode), facts);
      const std::string actual = to_string(s.precision);
      std::string answer = actual == mode ? "yes" : "yes, runs as " + actual;
      if (s.accelerator == c10::DeviceType::CPU && actual.rfind("bf16", 0) == 0 &&
          !emulated.empty())
        answer += " (emulated: several times slower than 32-true)";
      r.precisions.emplace_back(mode, answer);
    } catch (const Error& e) {
      r.precisions.emplace_back(mode, "no: " + reason(e.what()));
    }
  }
  return r;
}

std::string format_text(const FabricResolution& r) {
  ReportTable t;
  t.section("Fabric would use (config: " + r.config + ")");
  if (!r.error.empty()) {
    t.row("error", r.error);
  } else {
    t.row("launch environment",
          r.environment + (r.external_launcher ? " (processes started by the launcher)"
                                               : " (Fabric starts the processes itself)"));
    t.row("world size", std::to_string(r.world_size));
    t.row("this process", "rank " + std::to_string(r.global_rank) + " (local " +
                              std::to_string(r.local_rank) + ", node " +
                              std::to_string(r.node_rank) + ")");
    t.row("accelerator", r.accelerator);
    std::string devices;
    for (const auto& d : r.devices) devices += (devices.empty() ? "" : ", ") + d;
    t.row("devices", devices);
    t.row("strategy", r.strategy);
    t.row("precision", r.precision);
    t.row("threads per process", r.threads > 0
                                     ? std::to_string(r.threads) + " (" + r.threads_reason + ")"
                                     : "LibTorch's default (CPUs unknown)");
  }
  t.row("CPU bfloat16", r.cpu_bf16);
  for (const auto& [mode, answer] : r.precisions) t.row("precision " + mode, answer);
  for (const auto& w : r.warnings) t.line("note: " + w);
  return t.str();
}

nlohmann::json to_json(const FabricResolution& r) {
  nlohmann::json precisions = nlohmann::json::object();
  for (const auto& [mode, answer] : r.precisions) precisions[mode] = answer;
  return {{"config", r.config},           {"error", r.error},
          {"environment", r.environment}, {"external_launcher", r.external_launcher},
          {"world_size", r.world_size},   {"global_rank", r.global_rank},
          {"local_rank", r.local_rank},   {"node_rank", r.node_rank},
          {"accelerator", r.accelerator}, {"devices", r.devices},
          {"device", r.device},           {"strategy", r.strategy},
          {"precision", r.precision},     {"precisions", precisions},
          {"threads", r.threads},         {"threads_reason", r.threads_reason},
          {"cpu_bf16", r.cpu_bf16},       {"warnings", r.warnings}};
}

}  // namespace fabric::tools
