#include "tools/sweep/state.h"

#include <fstream>
#include <sstream>

#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"

namespace fabric::sweep {
namespace {

constexpr int kVersion = 1;

RunStatus status_from(const std::string& s) {
  for (RunStatus st :
       {RunStatus::kPending, RunStatus::kRunning, RunStatus::kSubmitted, RunStatus::kDone,
        RunStatus::kDiverged, RunStatus::kFailed, RunStatus::kInterrupted, RunStatus::kPruned}) {
    if (to_string(st) == s) return st;
  }
  throw Error("unknown run status '" + s + "'");
}

}  // namespace

std::string to_string(RunStatus status) {
  switch (status) {
    case RunStatus::kPending:
      return "pending";
    case RunStatus::kRunning:
      return "running";
    case RunStatus::kSubmitted:
      return "submitted";
    case RunStatus::kDone:
      return "done";
    case RunStatus::kDiverged:
      return "diverged";
    case RunStatus::kFailed:
      return "failed";
    case RunStatus::kInterrupted:
      return "interrupted";
    case RunStatus::kPruned:
      return "pruned";
  }
  return "pending";
}

SweepState SweepState::load(const std::filesystem::path& path) {
  SweepState state;
  state.path_ = path;
  std::ifstream in(path);
  if (!in) return state;
  try {
    std::ostringstream text;
    text << in.rdbuf();
    const auto j = nlohmann::json::parse(text.str());
    if (j.at("version").get<int>() != kVersion)
      throw Error("version " + j.at("version").dump() + " (this sweep tool reads version 1)");
    for (const auto& [id, r] : j.at("runs").items()) {
      RunRecord rec;
      rec.status = status_from(r.at("status").get<std::string>());
      if (rec.status == RunStatus::kRunning) rec.status = RunStatus::kInterrupted;
      rec.exit_code = r.value("exit_code", 0);
      rec.reason = r.value("reason", "");
      rec.attempts = r.value("attempts", 0);
      rec.wall_seconds = r.value("wall_seconds", 0.0);
      rec.run_dir = r.value("run_dir", "");
      rec.log = r.value("log", "");
      rec.summary = r.value("summary", nlohmann::json());
      rec.slurm_job = r.value("slurm_job", "");
      if (r.contains("reports"))
        for (const auto& point : r.at("reports"))
          rec.reports[point.at(0).get<double>()] = point.at(1).get<double>();
      rec.rung = r.value("rung", -1);
      rec.trial = r.value("trial", static_cast<int64_t>(-1));
      if (r.contains("values"))
        for (const auto& kv : r.at("values"))
          rec.values.emplace_back(kv.at(0).get<std::string>(), kv.at(1).get<std::string>());
      if (r.contains("command"))
        for (const auto& arg : r.at("command")) rec.command.push_back(arg.get<std::string>());
      rec.config_hash = r.value("config_hash", "");
      state.runs_[id] = std::move(rec);
    }
  } catch (const std::exception& e) {
    throw Error("cannot read the sweep state " + path.string() + ": " + e.what() +
                "; move the file away to start the sweep over");
  }
  return state;
}

void SweepState::save() const {
  nlohmann::json runs = nlohmann::json::object();
  for (const auto& [id, r] : runs_) {
    runs[id] = {{"status", to_string(r.status)},
                {"exit_code", r.exit_code},
                {"reason", r.reason},
                {"attempts", r.attempts},
                {"wall_seconds", r.wall_seconds},
                {"run_dir", r.run_dir},
                {"log", r.log},
                {"summary", r.summary}};
    if (!r.slurm_job.empty()) runs[id]["slurm_job"] = r.slurm_job;
    if (!r.reports.empty()) {
      nlohmann::json reports = nlohmann::json::array();
      for (const auto& [at, value] : r.reports) reports.push_back({at, value});
      runs[id]["reports"] = reports;
    }
    if (r.rung >= 0) runs[id]["rung"] = r.rung;
    if (!r.command.empty()) runs[id]["command"] = r.command;
    if (!r.config_hash.empty()) runs[id]["config_hash"] = r.config_hash;
    if (r.trial >= 0) {
      runs[id]["trial"] = r.trial;
      nlohmann::json values = nlohmann::json::array();
      for (const auto& [k, v] : r.values) values.push_back({k, v});
      runs[id]["values"] = values;
    }
  }
  const nlohmann::json j = {{"version", kVersion}, {"runs", runs}};
  write_file_atomically(path_, j.dump(2) + "\n");
}

}  // namespace fabric::sweep
