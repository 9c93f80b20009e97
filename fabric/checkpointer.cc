#include "fabric/checkpointer.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <optional>
#include <regex>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/output_check.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/core/atomic_file.h"
#include "fabric/core/paths.h"
#include "fabric/launchers/job_progress.h"
#include "fabric/logging/run_dir.h"
#include "strategies/collectives.h"

namespace fabric {
namespace fs = std::filesystem;

namespace {

// Whether every floating-point tensor in `value` is finite.
bool all_finite(const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    return !t.defined() || !t.is_floating_point() || t.numel() == 0 ||
           torch::isfinite(t).all().item<bool>();
  }
  if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict())
      if (!all_finite(item.value())) return false;
    return true;
  }
  if (value.isList()) {
    for (const auto& item : value.toList())
      if (!all_finite(item)) return false;
    return true;
  }
  if (value.isTensorList()) {
    for (const auto& t : value.toTensorVector())
      if (!all_finite(t)) return false;
    return true;
  }
  if (value.isTuple()) {
    for (const auto& item : value.toTupleRef().elements())
      if (!all_finite(item)) return false;
  }
  return true;
}

}  // namespace

std::vector<fs::path> checkpoints_in(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if ((entry.is_regular_file(ec) || is_sharded_checkpoint(entry.path())) &&
        checkpoint_step(entry.path().filename().string()) >= 0)
      out.push_back(entry.path());
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
    return checkpoint_step(a.filename().string()) < checkpoint_step(b.filename().string());
  });
  return out;
}

int64_t checkpoint_step(const std::string& file_name) {
  static const std::regex name("step-([0-9]{1,18})\\.ckpt");
  std::smatch m;
  return std::regex_match(file_name, m, name) ? std::stoll(m[1].str()) : -1;
}

Checkpointer::Checkpointer(Fabric& f, CheckpointState state, const std::string& name,
                           const fs::path& run_dir)
    : f_(f),
      state_(std::move(state)),
      options_(CheckpointerOptions::from_config(f.config(), name, run_dir)) {
  state_.add("checkpointer.step", step_).add("checkpointer.epoch", epoch_);
  resume(options_.resume);
  claim_dir();
}

namespace {

// "" when `dir` exists as a folder this process can write (created if missing), else why not.
std::string unwritable_folder(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    return dir.string() + " cannot be a folder (" +
           (ec ? ec.message() : std::string("a file is there")) + ")";
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    return dir.string() + " is not writable (" + std::strerror(errno) + ")";
  return "";
}

}  // namespace

void Checkpointer::claim_dir() {
  // Rank 0 looks, before training: a folder it cannot write, another run's checkpoints, or an
  // export_weights folder it cannot write (found at the end of the run otherwise).
  std::string key, problem;
  if (f_.is_global_zero()) {
    const auto files = checkpoints_in(dir_);
    std::error_code ec;
    const bool continues =
        !resumed_from_.empty() && fs::equivalent(fs::path(resumed_from_).parent_path(), dir_, ec);
    if (!files.empty() && !continues) {
      key = "checkpoint.dir";
      problem = dir_.string() + " holds the checkpoints of another run (newest " +
                files.back().filename().string() +
                "), which this run would overwrite; continue that run with "
                "checkpoint.resume=auto (or its path), or give this run a folder of its own (the "
                "default {run_dir}/checkpoints)";
    } else if (const std::string why = unwritable_folder(dir_); !why.empty()) {
      key = "checkpoint.dir";
      problem = why + "; give a folder this run can write";
    } else if (!options_.export_weights.empty()) {
      if (const std::string why =
              unwritable_folder(fs::path(options_.export_weights).parent_path());
          !why.empty()) {
        key = "checkpoint.export_weights";
        problem = why + "; give a path in a folder this run can write, or none";
      }
    }
  }
  if (f_.world_size() > 1) {
    key = f_.broadcast(key);
    problem = f_.broadcast(problem);
  }
  if (!problem.empty()) throw f_.config().error_at(key, problem);
}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();
  if (!write_error_.empty()) std::cerr << "error: checkpoint.async: " << write_error_ << std::endl;
}

std::string Checkpointer::not_finite_warning(int64_t step) {
  return "warning: checkpoint at step " + std::to_string(step) +
         " not written: the weights are not finite (NaN or inf); the newest checkpoint stays the "
         "one before (trainer.stop_on_nonfinite stops such a run)";
}

bool Checkpointer::state_is_finite() {
  // One flag per tensor, reduced on the device: a single host synchronization per save.
  std::vector<torch::Tensor> flags;
  auto check = [&flags](const torch::Tensor& t) {
    if (t.defined() && t.is_floating_point() && t.numel() > 0)
      flags.push_back(torch::isfinite(t).all());
  };
  torch::NoGradGuard no_grad;
  for (const auto& e : state_.entries()) {
    if (e.module) {
      // Only what the entry saves (CheckpointState::add's `keep`).
      auto& module = *e.module;
      for (const auto& p : module.named_parameters())
        if (!e.keep || e.keep(p.key())) check(p.value());
      for (const auto& b : module.named_buffers())
        if (!e.keep || e.keep(b.key())) check(b.value());
    } else if (e.optimizer) {
      // Under sharding strategies the optimizer holds the parameters' shards.
      for (const auto& group : e.optimizer->param_groups())
        for (const auto& p : group.params()) check(p);
    }
  }
  bool finite = true;
  if (!flags.empty()) {
    std::vector<torch::Tensor> on_one_device;
    for (const auto& f : flags) on_one_device.push_back(f.to(flags.front().device()));
    finite = torch::stack(on_one_device).all().item<bool>();
  }
  return f_.all_reduce(finite ? 1.0 : 0.0, ReduceOp::kMin) > 0.5;
}

fs::path Checkpointer::save() {
  char file_name[64];
  std::snprintf(file_name, sizeof(file_name), "step-%08lld.ckpt", static_cast<long long>(step_));
  const fs::path path = dir_ / file_name;
  // Full format under checkpoint.async: rank 0's snapshot holds the whole state and is checked
  // for non-finite values there, in the background. Otherwise every rank checks now.
  const bool check_later = options_.async && !f_.saves_sharded();
  if (!check_later && !state_is_finite()) {
    f_.print(not_finite_warning(step_));
    saved_step_ = step_;  // finish() does not try again
    saved_epoch_ = epoch_;
    return {};
  }
  if (options_.async) {
    wait_for_write();
    prepare_dir();
    // The stall: a copy in host memory (into the previous snapshot's buffers).
    std::function<void()> write = f_.snapshot_for_save(path.string(), state_, snapshot_);
    const bool zero = f_.is_global_zero();
    writer_ =
        std::thread([this, path, zero, check_later, write = std::move(write), taken = snapshot_] {
          try {
            if (check_later && taken && !all_finite(*taken)) {
              write_warning_ = not_finite_warning(checkpoint_step(path.filename().string()));
              return;
            }
            if (write) write();
            if (zero) publish(path);
          } catch (const std::exception& e) {
            write_error_ = e.what();
          }
        });
  } else {
    this->write(file_name);
    on_global_zero(f_.strategy(), [&] { publish(path); });
  }
  saved_step_ = step_;
  saved_epoch_ = epoch_;
  return path;
}

void Checkpointer::publish(const fs::path& path) {
  write_file_atomically(dir_ / "latest", path.filename().string() + "\n");
  if (options_.keep_last <= 0) return;
  // Steps after the one just saved first: a run resumed from an older checkpoint of this folder
  // (step 4 of 4, 6, 8) cannot have written them; they belong to the abandoned run and go before
  // this run's own. Then the lowest steps.
  auto files = checkpoints_in(dir_);
  const int64_t saved = checkpoint_step(path.filename().string());
  std::stable_partition(files.begin(), files.end(), [&](const fs::path& f) {
    return checkpoint_step(f.filename().string()) > saved;
  });
  for (size_t i = 0; i + static_cast<size_t>(options_.keep_last) < files.size(); ++i) {
    if (files[i] == path) continue;
    std::error_code ec;
    remove_tree(files[i], ec);
    if (ec)
      throw Error("cannot delete the old checkpoint " + files[i].string() +
                  " (checkpoint.keep_last: " + std::to_string(options_.keep_last) +
                  "): " + ec.message());
  }
}

void Checkpointer::wait_for_write() {
  if (!options_.async) return;
  if (writer_.joinable()) writer_.join();
  if (!write_warning_.empty()) f_.print(write_warning_);
  write_warning_.clear();
  // The first failing rank's error, on every rank (sharded folders: every rank writes).
  const double world = static_cast<double>(f_.world_size());
  const auto first = static_cast<int64_t>(f_.all_reduce(
      write_error_.empty() ? world : static_cast<double>(f_.global_rank()), ReduceOp::kMin));
  if (first >= f_.world_size()) return;
  // Every rank's writer has ended (the all_reduce above comes after each join): rank 0 removes
  // what the failed save left (another rank may have recreated its temporary folder after rank
  // 0 gave up on it), before the broadcast lets any rank throw and end the job.
  on_global_zero(f_.strategy(), [&] { remove_temporaries(); });
  const std::string failed = f_.broadcast(write_error_, first);
  write_error_.clear();
  throw Error("checkpoint.async: " + failed);
}

fs::path Checkpointer::save_aside(const std::string& prefix) {
  char file_name[128];
  std::snprintf(file_name, sizeof(file_name), "%s-step-%08lld.ckpt", prefix.c_str(),
                static_cast<long long>(step_));
  return write(file_name);
}

void Checkpointer::prepare_dir() {
  on_global_zero(f_.strategy(), [&] {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec) throw Error("cannot write checkpoints to " + dir_.string() + ": " + ec.message());
    remove_temporaries();  // of a save that was killed
  });
}

void Checkpointer::remove_temporaries() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec))
    if (entry.path().filename().string().find(".tmp.") != std::string::npos)
      remove_tree(entry.path(), ec);
}

fs::path Checkpointer::write(const std::string& file_name) {
  wait_for_write();  // nothing else in flight while the folder is tidied and written
  prepare_dir();
  const fs::path path = dir_ / file_name;
  f_.save(path.string(), state_);
  return path;
}

void Checkpointer::step_end() {
  ++step_;
  publish_step(step_);
  if (options_.every_n_steps > 0 && step_ % options_.every_n_steps == 0) save();
}

void Checkpointer::epoch_end() {
  ++epoch_;
  if (options_.every_n_epochs > 0 && epoch_ % options_.every_n_epochs == 0) save();
}

void Checkpointer::finish() {
  if (options_.save_last && (saved_step_ != step_ || saved_epoch_ != epoch_)) save();
  wait_for_write();
  if (options_.export_weights.empty()) return;
  torch::nn::Module* module = export_module_;
  for (const auto& e : state_.entries())
    if (!module && e.module) module = e.module;
  if (!module) return;
  // A diverged run's weights are no result: exported, they would pass for one. Skipped with a
  // warning, as checkpoints are (not_finite_warning); export_weights() is then "", so that the
  // program neither reports an export nor writes one beside it (an EMA copy).
  if (!state_is_finite()) {
    f_.print("warning: checkpoint.export_weights: ", options_.export_weights,
             " not written: the weights are not finite (NaN or inf) after step ", step_,
             "; the run diverged: lower optimizer.lr (trainer.stop_on_nonfinite stops such a run "
             "early)");
    export_skipped_ = true;
    return;
  }
  if (!options_.export_hf) {
    f_.save_weights(*module, options_.export_weights);
    return;
  }
  if (!hf_export_)
    throw f_.config().error_at(
        "checkpoint.export_format",
        "hf, but this program writes no Hugging Face architecture (examples:gpt does); use "
        "pt or safetensors (the last checkpoint is saved)");
  const ScopeGuard whole = f_.strategy().materialize_parameters(*module, false);
  const StateDict all = f_.strategy().gather_pipeline_state(state_dict(*module));
  on_global_zero(f_.strategy(), [&] { hf_export_(all, options_.export_weights); });
}

}  // namespace fabric
