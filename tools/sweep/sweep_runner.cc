#include "tools/sweep/sweep_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>

#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "tools/sweep/sweep_pruner.h"

namespace fabric::sweep {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

constexpr auto kStopGrace = std::chrono::seconds(10);

struct Running {
  const SweepRun* run;
  int slot;
  Clock::time_point start;
  fs::file_time_type file_start;
  std::string prune_reason;                  // set once the pruner stopped it (SIGTERM sent)
  std::optional<Clock::time_point> kill_at;  // SIGKILL then, when it has not ended
  fs::path metrics;                          // the attempt's metrics.csv, once it exists
};

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

// Whether `name` is `id` or `id-N` (a run directory of that run; RunDirectory appends -N).
bool is_run_dir_of(const std::string& name, const std::string& id) {
  if (name.rfind(id, 0) != 0) return false;
  if (name.size() == id.size()) return true;
  return name.size() > id.size() + 1 && name[id.size()] == '-' &&
         name.find_first_not_of("0123456789", id.size() + 1) == std::string::npos;
}

// The run directory of the attempt: runs/<id> or runs/<id>-N holding `file` (summary.json,
// metrics.csv) written since the attempt started (newest first).
std::string find_attempt_dir(const fs::path& runs, const std::string& id, fs::file_time_type since,
                             const char* file = "summary.json") {
  std::error_code ec;
  fs::path best;
  fs::file_time_type best_time{};
  for (const auto& e : fs::directory_iterator(runs, ec)) {
    if (!is_run_dir_of(e.path().filename().string(), id)) continue;
    const auto t = fs::last_write_time(e.path() / file, ec);
    if (ec || t < since) continue;
    if (best.empty() || t > best_time) best = e.path(), best_time = t;
  }
  return best.string();
}

// A failed attempt's run folder (written since `since`) that holds no checkpoint to resume from
// is removed, so the retry writes runs/<id> again rather than runs/<id>-1; its output stays in
// logs/<id>.log.
void remove_failed_attempt(const fs::path& runs, const std::string& id, fs::file_time_type since) {
  const std::string dir = find_attempt_dir(runs, id, since, "config.yaml");
  if (dir.empty()) return;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (const std::string name = it->path().filename().string();
        name.rfind("step-", 0) == 0 && name.size() > 10 &&
        name.compare(name.size() - 5, 5, ".ckpt") == 0)
      return;  // step-NNNNNNNN.ckpt (fabric/checkpointer.h): checkpoint.resume may continue it
  if (!ec) remove_tree(dir, ec);
}

}  // namespace

std::vector<std::string> run_command_line(const SweepSpec& spec, const SweepRun& run,
                                          const RunnerOptions& options) {
  std::vector<std::string> argv = {options.binary.string()};
  if (!options.config.empty()) argv.push_back("--config=" + options.config);
  for (auto& a : run.arguments(spec.common, spec.seed_key)) argv.push_back(std::move(a));
  argv.push_back("logging.run_dir=" + (options.sweep_dir / "runs" / run.id).string());
  for (const auto& e : options.extra) argv.push_back(e);
  return argv;
}

namespace {

// Reads the attempt's summary.json (in runs/<id> or runs/<id>-N, written since `since`) into
// rec.run_dir and rec.summary; returns why not ("" when read).
std::string read_summary(const SweepRun& run, fs::file_time_type since, const fs::path& runs,
                         RunRecord& rec) {
  rec.run_dir = find_attempt_dir(runs, run.id, since);
  rec.summary = nlohmann::json();
  std::ifstream in(fs::path(rec.run_dir) / "summary.json");
  if (rec.run_dir.empty() || !in)
    return "wrote no summary.json under " + display_path(runs / run.id) +
           " (the sweep reads its metric there: log it with Fabric::log, which writes "
           "summary.json at the end of launch; docs/experiments.md)";
  try {
    in >> rec.summary;
  } catch (const std::exception& e) {
    rec.summary = nlohmann::json();
    return "summary.json is not JSON: " + std::string(e.what());
  }
  return "";
}

}  // namespace

std::string record_exit(const SweepSpec& spec, const SweepRun& run, int exit_code,
                        const std::string& how, double wall_seconds, fs::file_time_type since,
                        const fs::path& runs, RunRecord& rec) {
  rec.wall_seconds = wall_seconds;
  rec.exit_code = exit_code;
  rec.reason.clear();
  std::string line = run.id + " in " + seconds(wall_seconds);
  if (exit_code == kDivergedExitStatus) {
    // A result, not a failure: running it again repeats the same deterministic divergence. The
    // reason is the program's stop message (summary.json "stopped"), else its log's last line.
    read_summary(run, since, runs, rec);
    const auto& summary = rec.summary;
    if (summary.is_object() && summary.contains("stopped") && summary["stopped"].is_string())
      rec.reason = summary["stopped"].get<std::string>();
    if (rec.reason.empty()) rec.reason = last_line_of_file(rec.log);
    if (rec.reason.empty()) rec.reason = "stopped on non-finite values (exit 3)";
    rec.status = RunStatus::kDiverged;
    return "diverged " + line + ": " + rec.reason;
  }
  if (exit_code == 0) {
    const std::string missing = read_summary(run, since, runs, rec);
    if (!missing.empty()) rec.reason = "exited 0 but " + missing;
  } else {
    rec.reason = how;
    const std::string tail = last_line_of_file(rec.log);
    if (!tail.empty()) rec.reason += ": " + tail;
    remove_failed_attempt(runs, run.id, since);
  }
  rec.status = rec.reason.empty() ? RunStatus::kDone : RunStatus::kFailed;
  if (rec.status == RunStatus::kDone)
    return "done " + line + ": " + spec.metric + " " +
           (rec.summary.contains(spec.metric) ? rec.summary[spec.metric].dump()
                                              : std::string("(not in summary.json)"));
  return "FAILED " + line + ": " + rec.reason + " (log: " + display_path(rec.log) + ")";
}

int run_pending(const SweepSpec& spec, SweepState& state, const RunnerOptions& options,
                std::ostream& out) {
  std::deque<const SweepRun*> pending;
  for (const SweepRun& run : spec.runs)
    if (!has_result(state[run.id].status)) pending.push_back(&run);
  if (options.max_runs > 0 && static_cast<int>(pending.size()) > options.max_runs)
    pending.resize(static_cast<size_t>(options.max_runs));
  const int total = static_cast<int>(pending.size()) + options.more_runs;
  const fs::path logs = options.sweep_dir / "logs", runs = options.sweep_dir / "runs";
  fs::create_directories(logs);
  fs::create_directories(runs);

  // Signals are received synchronously (sigtimedwait): none is lost between checks.
  sigset_t watched, previous;
  sigemptyset(&watched);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&watched, s);
  sigprocmask(SIG_BLOCK, &watched, &previous);

  const int slots = std::max(1, options.parallel);
  std::vector<bool> slot_busy(static_cast<size_t>(slots), false);
  std::map<pid_t, Running> running;
  int started = 0, stop_signal = 0;
  std::optional<Clock::time_point> kill_at;

  const PrunerSpec& pruner = spec.pruner;
  PruneWatch watch(pruner, state, options.external_pruner);
  std::map<std::string, const SweepRun*> by_id;
  for (const SweepRun& run : spec.runs) by_id[run.id] = &run;

  auto launch = [&](const SweepRun* run, bool promoted) {
    int slot = 0;
    while (slot_busy[static_cast<size_t>(slot)]) ++slot;
    RunRecord& rec = state[run->id];
    rec.status = RunStatus::kRunning;
    ++rec.attempts;
    rec.log = (logs / (run->id + ".log")).string();
    rec.reason.clear();
    state.save();
    const int fd = open(rec.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw Error("cannot write " + rec.log + ": " + std::strerror(errno));
    const auto argv = run_command_line(spec, *run, options);
    std::string header = "=== sweep attempt " + std::to_string(rec.attempts) + ":";
    for (const auto& a : argv) header += " " + a;
    header += "\n";
    (void)!write(fd, header.data(), header.size());
    std::vector<std::pair<std::string, std::string>> env;
    if (!options.gpu_slots.empty())
      env.emplace_back("CUDA_VISIBLE_DEVICES", options.gpu_slots[static_cast<size_t>(slot)]);
    if (options.cpus_per_run > 0)
      env.emplace_back("FABRIC_CPUS", std::to_string(options.cpus_per_run));
    const auto file_start = fs::file_time_type::clock::now() - std::chrono::seconds(2);
    pid_t pid;
    try {
      pid = spawn(argv, options.cwd, fd, env);
    } catch (...) {
      close(fd);
      throw;
    }
    close(fd);
    slot_busy[static_cast<size_t>(slot)] = true;
    running[pid] = {run, slot, Clock::now(), file_start, {}, {}, {}};
    if (promoted) {
      out << "promote " << run->id << " (asha: now in the top 1/" << pruner.reduction_factor
          << " at rung " << rec.rung << "; resumes from its checkpoint)";
    } else {
      ++started;
      out << "[" << started << "/" << total << "] start " << run->id;
    }
    if (!options.gpu_slots.empty())
      out << " (GPU " << options.gpu_slots[static_cast<size_t>(slot)] << ")";
    out << std::endl;
  };

  // Merges the attempt's metrics.csv (found once) into the run's reports; true when they changed.
  auto read_reports_of = [&](Running& r) {
    if (r.metrics.empty()) {
      const std::string dir = find_attempt_dir(runs, r.run->id, r.file_start, "metrics.csv");
      if (dir.empty()) return false;
      r.metrics = fs::path(dir) / "metrics.csv";
    }
    const bool changed = watch.read(*r.run, r.metrics);
    if (const auto warning = watch.take_warning()) out << "warning: " << *warning << std::endl;
    return changed;
  };
  // The pruner's look at every running run with new reports: SIGTERM to those it stops.
  auto prune = [&]() {
    for (auto& [pid, r] : running) {
      if (!r.prune_reason.empty() || !read_reports_of(r)) continue;
      if (const auto reason = watch.verdict(*r.run)) {
        r.prune_reason = *reason;
        r.kill_at = Clock::now() + kStopGrace;
        kill(-pid, SIGTERM);
        out << "pruning " << r.run->id << ": " << *reason << std::endl;
      }
      state.save();
    }
  };

  auto finished = [&](pid_t pid, int status) {
    Running r = std::move(running.at(pid));
    running.erase(pid);
    slot_busy[static_cast<size_t>(r.slot)] = false;
    RunRecord& rec = state[r.run->id];
    const double wall = std::chrono::duration<double>(Clock::now() - r.start).count();
    if (stop_signal == 0 && !r.prune_reason.empty()) {
      read_reports_of(r);  // the rows written on the way out
      // Done when it completed before the SIGTERM took effect: exit 0, or a summary.json without a
      // stop message written by this attempt (the signal landed while the program was exiting,
      // after its last evaluation: e.g. a pruner judging at a rung at the run's last epoch).
      RunRecord probe;
      read_summary(*r.run, r.file_start, runs, probe);
      const bool completed =
          probe.summary.is_object() && probe.summary.value("stopped", std::string()).empty();
      const bool finished_anyway = status_code(status) == 0 || completed;
      if (finished_anyway) {
        out << record_exit(spec, *r.run, 0, "exit 0", wall, r.file_start, runs, rec) << std::endl;
        rec.exit_code = status_code(status);
      } else {
        rec.wall_seconds = wall;
        rec.exit_code = status_code(status);
        rec.status = RunStatus::kPruned;
        rec.reason = "pruned: " + r.prune_reason;
        rec.run_dir = r.metrics.parent_path().string();
        out << "pruned " << r.run->id << " in " << seconds(wall) << ": " << r.prune_reason
            << std::endl;
      }
    } else if (stop_signal != 0) {
      rec.wall_seconds = wall;
      rec.exit_code = status_code(status);
      rec.status = RunStatus::kInterrupted;
      rec.reason = "interrupted by the sweep's signal " + std::to_string(stop_signal);
      out << "interrupted " << r.run->id << " in " << seconds(wall) << std::endl;
    } else {
      const std::string how = WIFSIGNALED(status)
                                  ? "killed by signal " + std::to_string(WTERMSIG(status))
                                  : "exit " + std::to_string(status_code(status));
      out << record_exit(spec, *r.run, status_code(status), how, wall, r.file_start, runs, rec)
          << std::endl;
      if (watch.active()) {  // its last reports, and the rungs they reached
        read_reports_of(r);
        watch.ended(*r.run);
        if (const auto warning = watch.take_warning()) out << "warning: " << *warning << std::endl;
      }
    }
    state.save();
    if (options.on_result && has_result(rec.status)) options.on_result(*r.run, rec);
  };

  auto stop_all = [&](int sig) {
    for (const auto& [pid, r] : running) kill(-pid, sig);
  };

  // asha: a pruned run that is now in the top of its rung resumes before a new run starts.
  auto next_promotion = [&]() -> const SweepRun* {
    for (const auto& id : watch.promotions()) {
      auto it = by_id.find(id);
      if (it == by_id.end()) continue;
      bool is_running = false;
      for (const auto& [pid, r] : running) is_running |= r.run == it->second;
      if (!is_running) return it->second;
    }
    return nullptr;
  };

  while (true) {
    while (stop_signal == 0 && static_cast<int>(running.size()) < slots) {
      if (const SweepRun* promoted = next_promotion()) {
        launch(promoted, true);
      } else if (!pending.empty()) {
        launch(pending.front(), false);
        pending.pop_front();
      } else if (options.next_run && (options.max_runs == 0 || started < options.max_runs)) {
        const SweepRun* run = options.next_run();
        if (run == nullptr) break;
        by_id[run->id] = run;
        launch(run, false);
      } else {
        break;
      }
    }
    if (running.empty()) break;
    // With a pruner, metrics.csv is read 10 times a second (a decision comes within 0.1 s of the
    // report, plus the run's own reaction to SIGTERM).
    timespec timeout = watch.active() ? timespec{0, 100'000'000} : timespec{1, 0};
    siginfo_t info;
    const int sig = sigtimedwait(&watched, &info, &timeout);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (stop_signal == 0) {
        out << "sweep: stopping on signal " << sig << " (" << running.size()
            << " run(s) interrupted; run the same command again to continue)" << std::endl;
        stop_signal = sig;
        stop_all(SIGTERM);
        kill_at = Clock::now() + kStopGrace;
      }
    }
    if (kill_at && Clock::now() >= *kill_at) stop_all(SIGKILL);
    if (stop_signal == 0 && watch.active()) prune();
    for (const auto& [pid, r] : running)
      if (r.kill_at && Clock::now() >= *r.kill_at) kill(-pid, SIGKILL);
    // Reap whatever exited (also after a timeout: a SIGCHLD may have been merged).
    for (auto it = running.begin(); it != running.end();) {
      int status = 0;
      const pid_t pid = it->first;
      ++it;
      if (waitpid(pid, &status, WNOHANG) == pid) finished(pid, status);
    }
  }
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  return stop_signal == 0 ? 0 : 128 + stop_signal;
}

}  // namespace fabric::sweep
