#include "tools/sweep/runner.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>

#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "tools/sweep/pruner.h"

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

// Whether the folder `name` under runs/ belongs to run `id`: a folder belongs to the longest run
// id of the sweep it is a run directory of, so that runs "name=resnet" and "name=resnet-50" never
// take each other's folders. When `name` is `id-N`, the only longer id it could belong to is
// `name` itself (N holds no '-').
bool belongs_to(const std::string& name, const std::string& id, const SweepSpec& spec) {
  if (!is_run_dir_of(name, id)) return false;
  if (name.size() == id.size()) return true;
  return std::none_of(spec.runs.begin(), spec.runs.end(),
                      [&](const SweepRun& other) { return other.id == name; });
}

// The run directory of the attempt: runs/<id> or runs/<id>-N holding `file` (summary.json,
// metrics.csv) written since the attempt started (newest first).
std::string find_attempt_dir(const fs::path& runs, const std::string& id, fs::file_time_type since,
                             const SweepSpec& spec, const char* file = "summary.json") {
  std::error_code ec;
  fs::path best;
  fs::file_time_type best_time{};
  for (const auto& e : fs::directory_iterator(runs, ec)) {
    if (!belongs_to(e.path().filename().string(), id, spec)) continue;
    const auto t = fs::last_write_time(e.path() / file, ec);
    if (ec || t < since) continue;
    if (best.empty() || t > best_time) best = e.path(), best_time = t;
  }
  return best.string();
}

// A failed attempt's run folder (written since `since`) that holds no checkpoint to resume from
// is renamed runs/<id>.failed-<attempt> (kept: it may hold a summary.json or metrics written
// before the program crashed), so the retry writes runs/<id> again rather than runs/<id>-1.
// Returns the folder the attempt's files are in now ("" when it made none).
std::string set_aside_failed_attempt(const fs::path& runs, const SweepRun& run, int attempt,
                                     fs::file_time_type since, const SweepSpec& spec) {
  const std::string dir = find_attempt_dir(runs, run.id, since, spec, "config.yaml");
  if (dir.empty()) return "";
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (const std::string name = it->path().filename().string();
        name.rfind("step-", 0) == 0 && name.size() > 10 &&
        name.compare(name.size() - 5, 5, ".ckpt") == 0)
      return dir;  // step-NNNNNNNN.ckpt (fabric/checkpointer.h): checkpoint.resume may continue it
  if (ec) return dir;
  const std::string base = run.id + ".failed-" + std::to_string(attempt);
  fs::path target = runs / base;
  for (int k = 2; fs::exists(target, ec); ++k) target = runs / (base + "." + std::to_string(k));
  fs::rename(dir, target, ec);
  return ec ? dir : target.string();
}

// The program's last output line in `log`: "" when it printed nothing after the sweep's own
// "=== sweep attempt N: ..." header.
std::string program_last_line(const std::string& log) {
  std::string tail = last_line_of_file(log);
  if (tail.rfind("=== sweep attempt", 0) == 0) tail.clear();
  return tail;
}

}  // namespace

std::string double_quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::vector<std::string> run_command_line(const SweepSpec& spec, const SweepRun& run,
                                          const RunnerOptions& options) {
  std::vector<std::string> argv = {options.binary.string()};
  if (!options.config.empty()) argv.push_back("--config=" + options.config);
  for (auto& a : run.arguments(spec.common, spec.seed_key)) argv.push_back(std::move(a));
  argv.push_back("logging.run_dir=" +
                 double_quoted((options.sweep_dir / "runs" / run.id).string()));
  for (const auto& e : options.extra) argv.push_back(e);
  return argv;
}

namespace {

// Reads the attempt's summary.json (in runs/<id> or runs/<id>-N, written since `since`) into
// rec.run_dir and rec.summary; returns why not ("" when read).
std::string read_summary(const SweepSpec& spec, const SweepRun& run, fs::file_time_type since,
                         const fs::path& runs, RunRecord& rec) {
  rec.run_dir = find_attempt_dir(runs, run.id, since, spec);
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
    read_summary(spec, run, since, runs, rec);
    const auto& summary = rec.summary;
    if (summary.is_object() && summary.contains("stopped") && summary["stopped"].is_string())
      rec.reason = summary["stopped"].get<std::string>();
    if (rec.reason.empty()) rec.reason = program_last_line(rec.log);
    if (rec.reason.empty()) rec.reason = "stopped on non-finite values (exit 3)";
    rec.status = RunStatus::kDiverged;
    return "diverged " + line + ": " + rec.reason;
  }
  if (exit_code == 0) {
    const std::string missing = read_summary(spec, run, since, runs, rec);
    if (!missing.empty()) rec.reason = "exited 0 but " + missing;
    // A NaN or infinite metric is written as null (JSON has no such numbers): a diverged result.
    if (missing.empty() && rec.summary.is_object() && rec.summary.contains(spec.metric) &&
        rec.summary[spec.metric].is_null()) {
      rec.reason = spec.metric + " is not a finite number (null in summary.json)";
      rec.status = RunStatus::kDiverged;
      return "diverged " + line + ": " + rec.reason;
    }
  } else {
    rec.reason = how;
    const std::string tail = program_last_line(rec.log);
    if (!tail.empty()) rec.reason += ": " + tail;
    if (const std::string kept = set_aside_failed_attempt(runs, run, rec.attempts, since, spec);
        !kept.empty())
      rec.run_dir = kept;
  }
  rec.status = rec.reason.empty() ? RunStatus::kDone : RunStatus::kFailed;
  if (rec.status == RunStatus::kDone)
    return "done " + line + ": " + spec.metric + " " +
           (rec.summary.contains(spec.metric) ? rec.summary[spec.metric].dump()
                                              : std::string("(not in summary.json)"));
  return "FAILED " + line + ": " + rec.reason + " (log: " + display_path(rec.log) + ")";
}

namespace {

// One invocation of run_pending: the runs it starts, watches, prunes and reaps.
class SweepLoop {
 public:
  SweepLoop(const SweepSpec& spec, SweepState& state, const RunnerOptions& options,
            std::ostream& out)
      : spec_(spec),
        state_(state),
        options_(options),
        out_(out),
        logs_(options.sweep_dir / "logs"),
        runs_(options.sweep_dir / "runs"),
        slots_(std::max(1, options.parallel)),
        slot_busy_(static_cast<size_t>(slots_), false),
        pruner_(spec.pruner),
        watch_(pruner_, state, options.external_pruner) {
    for (const SweepRun& run : spec.runs)
      if (!has_result(state[run.id].status)) pending_.push_back(&run);
    if (options.max_runs > 0 && static_cast<int>(pending_.size()) > options.max_runs)
      pending_.resize(static_cast<size_t>(options.max_runs));
    total_ = static_cast<int>(pending_.size()) + options.more_runs;
    for (const SweepRun& run : spec.runs) by_id_[run.id] = &run;
    fs::create_directories(logs_);
    fs::create_directories(runs_);
  }

  // Runs until nothing is pending and nothing runs, or a signal stopped the sweep; returns 0, or
  // 128 + the signal.
  int run() {
    // Signals are received synchronously (sigtimedwait): none is lost between checks.
    sigemptyset(&watched_);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&watched_, s);
    sigset_t previous;
    sigprocmask(SIG_BLOCK, &watched_, &previous);
    while (true) {
      fill_slots();
      if (running_.empty()) break;
      wait_and_reap();
    }
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    if (stop_signal_ != 0) return 128 + stop_signal_;
    return asking_failed_ ? 1 : 0;
  }

 private:
  // Starts runs while slots are free: promotions first, then pending runs, then new ones.
  void fill_slots() {
    while (stop_signal_ == 0 && static_cast<int>(running_.size()) < slots_) {
      if (const SweepRun* promoted = next_promotion()) {
        launch(promoted, true);
      } else if (!pending_.empty()) {
        launch(pending_.front(), false);
        pending_.pop_front();
      } else if (options_.next_run && !asking_failed_ &&
                 (options_.max_runs == 0 || started_ < options_.max_runs)) {
        const SweepRun* run = nullptr;
        try {
          run = options_.next_run();
        } catch (const std::exception& e) {
          // e.g. Optuna's "database is locked": the running runs finish, the report is written.
          asking_failed_ = true;
          out_ << "warning: no new run could be asked for: " << describe(e) << "; no more runs "
               << "start in this invocation (the running ones finish; run the same command again "
               << "to go on)" << std::endl;
          break;
        }
        if (run == nullptr) break;
        by_id_[run->id] = run;
        launch(run, false);
      } else {
        break;
      }
    }
  }

  // Waits for a signal or the next look (0.1 s with a pruner, else 1 s), acts on it, and reaps
  // whatever exited.
  void wait_and_reap() {
    // With a pruner, metrics.csv is read 10 times a second (a decision comes within 0.1 s of the
    // report, plus the run's own reaction to SIGTERM).
    timespec timeout = watch_.active() ? timespec{0, 100'000'000} : timespec{1, 0};
    siginfo_t info;
    const int sig = sigtimedwait(&watched_, &info, &timeout);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      if (stop_signal_ == 0) {
        out_ << "sweep: stopping on signal " << sig << " (" << running_.size()
             << " run(s) interrupted; run the same command again to continue)" << std::endl;
        stop_signal_ = sig;
        stop_all(SIGTERM);
        kill_at_ = Clock::now() + kStopGrace;
      }
    }
    if (kill_at_ && Clock::now() >= *kill_at_) stop_all(SIGKILL);
    if (stop_signal_ == 0 && watch_.active()) prune();
    for (const auto& [pid, r] : running_)
      if (r.kill_at && Clock::now() >= *r.kill_at) kill(-pid, SIGKILL);
    // Reap whatever exited (also after a timeout: a SIGCHLD may have been merged).
    for (auto it = running_.begin(); it != running_.end();) {
      int status = 0;
      const pid_t pid = it->first;
      ++it;
      if (waitpid(pid, &status, WNOHANG) == pid) finished(pid, status);
    }
  }

  void launch(const SweepRun* run, bool promoted) {
    int slot = 0;
    while (slot_busy_[static_cast<size_t>(slot)]) ++slot;
    RunRecord& rec = state_[run->id];
    rec.status = RunStatus::kRunning;
    ++rec.attempts;
    rec.log = (logs_ / (run->id + ".log")).string();
    rec.reason.clear();
    state_.save();
    const int fd = open(rec.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw Error("cannot write " + rec.log + ": " + std::strerror(errno));
    const auto argv = run_command_line(spec_, *run, options_);
    rec.command.assign(argv.begin() + 1, argv.end());
    rec.config_hash = options_.config_hash;
    state_.save();
    std::string header = "=== sweep attempt " + std::to_string(rec.attempts) + ":";
    for (const auto& a : argv) header += " " + a;
    header += "\n";
    (void)!write(fd, header.data(), header.size());
    std::vector<std::pair<std::string, std::string>> env;
    if (!options_.gpu_slots.empty())
      env.emplace_back("CUDA_VISIBLE_DEVICES", options_.gpu_slots[static_cast<size_t>(slot)]);
    if (options_.cpus_per_run > 0)
      env.emplace_back("FABRIC_CPUS", std::to_string(options_.cpus_per_run));
    const auto file_start = fs::file_time_type::clock::now() - std::chrono::seconds(2);
    pid_t pid;
    try {
      pid = spawn(argv, options_.cwd, fd, env);
    } catch (...) {
      close(fd);
      throw;
    }
    close(fd);
    slot_busy_[static_cast<size_t>(slot)] = true;
    running_[pid] = {run, slot, Clock::now(), file_start, {}, {}, {}};
    if (promoted) {
      out_ << "promote " << run->id << " (asha: now in the top 1/" << pruner_.reduction_factor
           << " at rung " << rec.rung << "; resumes from its checkpoint)";
    } else {
      ++started_;
      out_ << "[" << started_ << "/" << total_ << "] start " << run->id;
    }
    if (!options_.gpu_slots.empty())
      out_ << " (GPU " << options_.gpu_slots[static_cast<size_t>(slot)] << ")";
    out_ << std::endl;
  }

  // Merges the attempt's metrics.csv (found once) into the run's reports; true when they changed.
  bool read_reports_of(Running& r) {
    if (r.metrics.empty()) {
      const std::string dir =
          find_attempt_dir(runs_, r.run->id, r.file_start, spec_, "metrics.csv");
      if (dir.empty()) return false;
      r.metrics = fs::path(dir) / "metrics.csv";
    }
    const bool changed = watch_.read(*r.run, r.metrics);
    if (const auto warning = watch_.take_warning()) out_ << "warning: " << *warning << std::endl;
    return changed;
  }

  // The pruner's look at every running run with new reports: SIGTERM to those it stops.
  void prune() {
    for (auto& [pid, r] : running_) {
      if (!r.prune_reason.empty() || !read_reports_of(r)) continue;
      if (const auto reason = watch_.verdict(*r.run)) {
        r.prune_reason = *reason;
        r.kill_at = Clock::now() + kStopGrace;
        kill(-pid, SIGTERM);
        out_ << "pruning " << r.run->id << ": " << *reason << std::endl;
      }
      state_.save();
    }
  }

  void finished(pid_t pid, int status) {
    Running r = std::move(running_.at(pid));
    running_.erase(pid);
    slot_busy_[static_cast<size_t>(r.slot)] = false;
    RunRecord& rec = state_[r.run->id];
    const double wall = std::chrono::duration<double>(Clock::now() - r.start).count();
    if (stop_signal_ == 0 && !r.prune_reason.empty()) {
      read_reports_of(r);  // the rows written on the way out
      // Done when it completed before the SIGTERM took effect: exit 0, or a summary.json of this
      // attempt saying it completed (the signal landed while the program was exiting, after its
      // last evaluation: e.g. a pruner judging at a rung at the run's last epoch). Fabric writes
      // summary.json on a SIGTERM stop too, with "exit_status": 143: that run was pruned.
      const bool finished_anyway = status_code(status) == 0 || completed_summary(r);
      if (finished_anyway) {
        out_ << record_exit(spec_, *r.run, 0, "exit 0", wall, r.file_start, runs_, rec)
             << std::endl;
        rec.exit_code = status_code(status);
      } else {
        rec.wall_seconds = wall;
        rec.exit_code = status_code(status);
        rec.status = RunStatus::kPruned;
        rec.reason = "pruned: " + r.prune_reason;
        rec.run_dir = r.metrics.parent_path().string();
        out_ << "pruned " << r.run->id << " in " << seconds(wall) << ": " << r.prune_reason
             << std::endl;
      }
    } else if (stop_signal_ != 0 &&
               !(WIFEXITED(status) && WEXITSTATUS(status) == 0 && completed_summary(r))) {
      rec.wall_seconds = wall;
      rec.exit_code = status_code(status);
      rec.status = RunStatus::kInterrupted;
      rec.reason = "interrupted by the sweep's signal " + std::to_string(stop_signal_);
      out_ << "interrupted " << r.run->id << " in " << seconds(wall) << std::endl;
    } else {
      const std::string how = WIFSIGNALED(status)
                                  ? "killed by signal " + std::to_string(WTERMSIG(status))
                                  : "exit " + std::to_string(status_code(status));
      out_ << record_exit(spec_, *r.run, status_code(status), how, wall, r.file_start, runs_, rec)
           << std::endl;
      if (watch_.active()) {  // its last reports, and the rungs they reached
        read_reports_of(r);
        watch_.ended(*r.run);
        if (const auto warning = watch_.take_warning())
          out_ << "warning: " << *warning << std::endl;
      }
    }
    state_.save();
    if (options_.on_result && has_result(rec.status)) options_.on_result(*r.run, rec);
  }

  // Whether the attempt wrote a summary.json that says it completed: no stop message and, when it
  // has one, exit_status 0.
  bool completed_summary(const Running& r) const {
    RunRecord probe;
    read_summary(spec_, *r.run, r.file_start, runs_, probe);
    const auto& summary = probe.summary;
    if (!summary.is_object()) return false;
    if (summary.contains("stopped") && summary["stopped"].is_string() &&
        !summary["stopped"].get<std::string>().empty())
      return false;
    if (summary.contains("exit_status"))
      return summary["exit_status"].is_number_integer() &&
             summary["exit_status"].get<int64_t>() == 0;
    return true;
  }

  void stop_all(int sig) {
    for (const auto& [pid, r] : running_) kill(-pid, sig);
  }

  // asha: a pruned run that is now in the top of its rung resumes before a new run starts.
  const SweepRun* next_promotion() {
    for (const auto& id : watch_.promotions()) {
      auto it = by_id_.find(id);
      if (it == by_id_.end()) continue;
      bool is_running = false;
      for (const auto& [pid, r] : running_) is_running |= r.run == it->second;
      if (!is_running) return it->second;
    }
    return nullptr;
  }

  const SweepSpec& spec_;
  SweepState& state_;
  const RunnerOptions& options_;
  std::ostream& out_;
  const fs::path logs_, runs_;
  const int slots_;
  std::vector<bool> slot_busy_;
  std::deque<const SweepRun*> pending_;
  int total_ = 0, started_ = 0, stop_signal_ = 0;
  bool asking_failed_ = false;  // next_run threw: no new runs in this invocation
  std::map<pid_t, Running> running_;
  std::optional<Clock::time_point> kill_at_;
  const PrunerSpec& pruner_;
  PruneWatch watch_;
  std::map<std::string, const SweepRun*> by_id_;
  sigset_t watched_;
};

}  // namespace

int run_pending(const SweepSpec& spec, SweepState& state, const RunnerOptions& options,
                std::ostream& out) {
  return SweepLoop(spec, state, options, out).run();
}

}  // namespace fabric::sweep
