// fabric::Checkpointer's resume side: which checkpoint checkpoint.resume (none, auto, PATH) or a
// restarted attempt (fabric.max_restarts, torchrun --max-restarts) continues from, and loading it.
// Saving, rotation and checkpoint.async are in checkpointer.cc.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <regex>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/checkpointer.h"
#include "fabric/core/paths.h"
#include "fabric/data/data_loader.h"
#include "fabric/launchers/job_progress.h"
#include "fabric/logging/run_dir.h"

namespace fabric {
namespace fs = std::filesystem;

std::vector<fs::path> Checkpointer::candidates() const { return candidates_since({}); }

std::vector<fs::path> Checkpointer::candidates_since(
    std::optional<std::chrono::system_clock::time_point> since) const {
  const std::vector<fs::path> folders = options_.search_dirs();
  std::vector<std::pair<fs::file_time_type, fs::path>> found;
  for (const auto& folder : folders)
    for (const auto& file : checkpoints_in(folder)) {
      std::error_code ec;
      const auto written = fs::last_write_time(file, ec);
      if (ec) continue;
      if (since && std::chrono::file_clock::to_sys(written) < *since) continue;
      found.emplace_back(written, file);
    }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  std::vector<fs::path> out;
  for (auto& [time, file] : found) out.push_back(std::move(file));
  return out;
}

std::string Checkpointer::newest_verified(
    const std::string& why, std::optional<std::chrono::system_clock::time_point> since) {
  std::string chosen;
  if (f_.is_global_zero()) {
    for (const auto& file : candidates_since(since)) {
      try {
        // Every byte, CRCs checked: a damaged one is skipped, and so is a file that is no
        // checkpoint (a weights file under a checkpoint's name).
        const c10::IValue checked = verify_checkpoint(file);
        if (!checked.isGenericDict() || !checked.toGenericDict().contains("fabric"))
          throw Error(file.string() + ": not a Fabric++ checkpoint (no \"fabric\" entry)");
        chosen = file.string();
        break;
      } catch (const Error& e) {
        std::cerr << "warning: " << why << ": skipping " << e.what() << std::endl;
      }
    }
  }
  return f_.broadcast(chosen, 0);
}

void Checkpointer::resume(const std::string& configured) {
  // A restarted attempt (fabric.max_restarts, torchrun --max-restarts) continues from the newest
  // complete checkpoint this job wrote; with none yet it starts as the first attempt did.
  const EnvGetter env = process_environment();
  const int64_t attempt = attempt_ = fabric::restart_attempt(env);
  const std::string& how = configured;
  if (attempt > 0) {
    const std::string restart = "restart " + std::to_string(attempt);
    // Unknown start (no /proc): no checkpoint counts as this job's.
    const std::string chosen = newest_verified(
        restart, job_start_time(env).value_or(std::chrono::system_clock::time_point::max()));
    if (chosen.empty()) {
      f_.print(restart,
               ": no complete checkpoint of this job yet; starting as its first attempt "
               "did (checkpoint.resume: ",
               configured, ")");
    } else {
      load_from(chosen);
      std::string lost;
      if (const auto failed = failed_attempt_step(env); failed && *failed >= step_)
        lost = "; the failed attempt had reached step " + std::to_string(*failed) + " (" +
               std::to_string(*failed - step_) + " steps to redo)";
      f_.print(restart, ": resumed from ", chosen, " at step ", step_, ", epoch ", epoch_, lost);
      return;
    }
  }
  if (how == "none") return;
  const Config& c = f_.config();
  std::string chosen;
  if (how == "auto") {
    chosen = newest_verified("checkpoint.resume=auto", std::nullopt);
    if (chosen.empty()) {
      // Checkpoints there, none readable: starting over would silently redo (and then rotate
      // away) the run they hold.
      std::string newest;
      if (f_.is_global_zero())
        if (const auto all = candidates(); !all.empty()) newest = all.front().string();
      newest = f_.broadcast(newest, 0);
      if (!newest.empty())
        throw c.error_at("checkpoint.resume",
                         "auto: no checkpoint of the earlier " + options_.name +
                             " run can be read (newest " + newest +
                             "; the warnings above say why); give an older checkpoint's path, "
                             "or checkpoint.resume=none to start over");
      f_.print("checkpoint.resume=auto: no complete checkpoint of an earlier ", options_.name,
               " run; starting from scratch");
      return;
    }
  } else {
    fs::path path = absolute_from_working_directory(how);
    std::error_code ec;
    // A folder's `latest` marker given as the checkpoint: the checkpoint it names.
    if (path.filename() == "latest" && fs::is_regular_file(path, ec)) path = path.parent_path();
    // A folder of checkpoints (not a sharded checkpoint, nor an incomplete one).
    if (fs::is_directory(path, ec) && !is_sharded_checkpoint(path) &&
        checkpoint_step(path.filename().string()) < 0) {
      std::ifstream marker(path / "latest");
      std::string latest;
      if (marker && std::getline(marker, latest) && !latest.empty()) {
        // `latest` names a checkpoint of this folder (Checkpointer writes it), nothing else.
        if (checkpoint_step(latest) < 0 || !fs::exists(path / latest, ec))
          throw c.error_at("checkpoint.resume",
                           (path / "latest").string() + " names '" + latest.substr(0, 200) +
                               "', which is no checkpoint of " + path.string() +
                               " (step-N.ckpt); give a checkpoint's path, or delete latest");
        path /= latest;
      } else {
        fs::directory_iterator readable(path, ec);
        if (ec)
          throw c.error_at("checkpoint.resume",
                           "cannot read " + path.string() + " (" + ec.message() + ")");
        const auto files = checkpoints_in(path);
        if (files.empty())
          throw c.error_at("checkpoint.resume", path.string() + " holds no checkpoint");
        path = files.back();
      }
    }
    if (!fs::exists(path, ec))
      throw c.error_at("checkpoint.resume",
                       path.string() + " does not exist (use none, auto, or a .ckpt file)");
    chosen = path.string();
  }
  try {
    load_from(chosen);
  } catch (const UnreadableArchive& e) {
    // A damaged file (a copy cut short, a disk that filled): the key that chose it, and what to
    // give instead.
    throw c.error_at("checkpoint.resume",
                     std::string(e.what()) +
                         "; give an older checkpoint's path, or checkpoint.resume=auto (the "
                         "newest readable one in checkpoint.dir)");
  }
  f_.print("resumed from ", chosen, " at step ", step_, ", epoch ", epoch_);
}

void Checkpointer::load_from(const std::string& chosen) {
  f_.load(chosen, state_);
  // The loop's epoch is the one the data continues with (a checkpoint taken at the last step of
  // an epoch, before epoch_end(), resumes with the next epoch).
  for (const auto& e : state_.entries())
    if (const auto* loader = dynamic_cast<const DataLoader*>(e.stateful)) {
      epoch_ = loader->state().epoch;
      break;
    }
  saved_step_ = step_;
  resumed_from_ = chosen;
  publish_step(step_);
}

}  // namespace fabric
