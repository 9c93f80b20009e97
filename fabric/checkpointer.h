// fabric::Checkpointer: the checkpoint policy of the `checkpoint:` config section.
//
//   checkpoint.dir            "{run_dir}/checkpoints"  fields {run_dir}, {name}
//   checkpoint.every_n_steps  0      save every N optimizer steps (0: never)
//   checkpoint.every_n_epochs 1      save every N epochs (0: never)
//   checkpoint.keep_last      3      newest checkpoints kept in dir (0: all)
//   checkpoint.save_last      true   save when training ends (finish())
//   checkpoint.resume         none   none | auto | PATH
//   checkpoint.export_weights "{run_dir}/weights.pt"  model weights at the end (none: off)
//   checkpoint.export_format  pt                      pt | safetensors (.pt becomes .safetensors)
//                                                     | hf (a Hugging Face folder: set_hf_export)
//
//   checkpoint.format         auto   full | sharded | auto (Fabric::save; sharded: each checkpoint
//                                    is a folder, fabric/checkpoint/sharded.h)
//   checkpoint.async          false  write in the background (below)
//
// Files: <dir>/step-00000120.ckpt (Fabric::save's format, named by the global step) and
// <dir>/latest, a one-line marker naming the newest complete checkpoint, replaced atomically only
// after that checkpoint is complete on every rank. Older checkpoints beyond keep_last are then
// deleted; temporary files left by a killed save are removed.
//
// A checkpoint folder belongs to one run. A run whose checkpoint.dir already holds checkpoints
// continues them (it resumed from one of them: resume auto, a path, a restart) or stops before
// training with a one-line error naming the folder, its newest checkpoint and the fix; it never
// writes over another run's checkpoints.
//
// resume: auto takes the newest complete checkpoint (by modification time) of this program's
// earlier runs: the folders logging.run_dir matches with any {timestamp} (and "-N" suffixes),
// each with checkpoint.dir inside. Unreadable or damaged files are skipped with a warning; with
// none found the run starts afresh (one line says so). resume: PATH takes a .ckpt file (or
// sharded folder), or a folder's `latest`. A checkpoint that does not fit the state (another
// model) is an error.
//
// checkpoint.async: a save takes the state into host memory (Fabric::snapshot_for_save: the
// training loop's only stall) and a background thread writes the file, crash-safe, while training
// goes on; `latest` moves and old checkpoints are deleted only once the file is complete. At
// most one write is in flight: the next save (and finish(), and the destructor) first waits for
// it; a failed write is reported there as fabric::Error on every rank. Sharded checkpoints
// (checkpoint.format): every rank writes its part in the background and rank 0 completes the
// folder once all are there (fabric/checkpoint/writer.h).
//
// Restarts (fabric.max_restarts, fabric/distributed/restart_agent.h; or torchrun --max-restarts):
// in a restarted attempt the constructor resumes from the newest complete checkpoint written
// since the job began (those of earlier attempts, found like resume: auto's, damaged ones skipped
// for the one before), whatever checkpoint.resume says; with none yet it starts as the first
// attempt did. It prints "restart 1: resumed from PATH at step 50, epoch 1; the failed attempt had
// reached step 57 (7 steps to redo)" (the last part under fabric.max_restarts only). step_end()
// tells the agent each completed step (job_progress.h).
//
// Example (examples/common/classification.cc is complete):
//   fabric::CheckpointState state;
//   state.add("model", model).add("optimizer", *optimizer).add("scheduler", scheduler)
//        .add("train_loader", train);
//   fabric::Checkpointer checkpoints(f, state, "cifar10", run.path());  // resumes here
//   for (int64_t epoch = checkpoints.epoch(); epoch < max_epochs; ++epoch) {
//     for (fabric::Batch& batch : train) { ...; f.step(*optimizer); scheduler.step();
//                                          checkpoints.step_end(); }
//     checkpoints.epoch_end();
//   }
//   checkpoints.finish();
#ifndef FABRIC_CHECKPOINTER_H_
#define FABRIC_CHECKPOINTER_H_

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fabric/fabric.h"
#include "fabric/logging/run_dir.h"

namespace fabric {

// The checkpoint: keys above, read and checked once (ConfigError at the key), as
// LRSchedule::from_config does for the scheduler: keys. The Checkpointer reads nothing else of
// the config (checkpoint.format is the Fabric's: Fabric::saves_sharded).
struct CheckpointerOptions {
  std::string name;           // the program's run name ({name})
  std::filesystem::path dir;  // checkpoint.dir with {run_dir} and {name} expanded, absolute
  std::string dir_pattern;    // checkpoint.dir as written
  int64_t every_n_steps = 0, every_n_epochs = 1, keep_last = 3;
  bool save_last = true, async = false;
  std::string resume = "none";  // none | auto | PATH (as written)
  std::string export_weights;   // expanded, absolute; "" when none
  bool export_hf = false;       // checkpoint.export_format hf: export_weights is a folder
  EarlierRuns earlier_runs;     // the run directories of `name`'s earlier runs (logging.run_dir)

  // `config`'s checkpoint: keys for program `name` whose run directory is `run_dir`.
  static CheckpointerOptions from_config(const Config& config, const std::string& name,
                                         const std::filesystem::path& run_dir);
  // Where resume: auto looks: `dir`, and when checkpoint.dir lies in the run directory, that
  // folder in each earlier run (`earlier_runs`, found now).
  std::vector<std::filesystem::path> search_dirs() const;
};

class Checkpointer {
 public:
  // Reads the policy from f.config() (ConfigError for a bad value) and, per checkpoint.resume,
  // loads a checkpoint into `state` (Fabric::load). `name` is the program's run name, `run_dir`
  // this run's folder (Fabric::create_run_directory). Collective.
  Checkpointer(Fabric& f, CheckpointState state, const std::string& name,
               const std::filesystem::path& run_dir);
  // The same in the job's run directory (Fabric::run_directory(), created here if the program
  // made none; {name}: Fabric::run_name()).
  Checkpointer(Fabric& f, CheckpointState state)
      : Checkpointer(f, std::move(state), f.run_name(), f.run_directory().path()) {}
  ~Checkpointer();  // waits for a background write (a failure is printed, not thrown)
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Optimizer steps and epochs completed (restored on resume).
  int64_t step() const { return step_; }
  int64_t epoch() const { return epoch_; }
  // The checkpoint resumed from ("" if none).
  const std::string& resumed_from() const { return resumed_from_; }
  // Where finish() exports the model's weights (checkpoint.export_weights, expanded); "": off, or
  // after a finish() that wrote nothing because the weights were not finite (it warns).
  const std::string& export_weights() const {
    return export_skipped_ ? no_export_ : options_.export_weights;
  }
  // Which attempt of a restarting job this is (fabric.max_restarts, torchrun --max-restarts): 0
  // for the first.
  int64_t restart_attempt() const { return attempt_; }
  const std::filesystem::path& dir() const { return options_.dir; }
  const CheckpointerOptions& options() const { return options_; }

  // After each optimizer step: counts it; saves every_n_steps. Collective.
  void step_end();
  // After each epoch: counts it; saves every_n_epochs. Collective.
  void epoch_end();
  // When training ends: saves (save_last) unless this step is saved already; exports the weights
  // of the state's first module (export_weights). Collective.
  void finish();
  // What writes a Hugging Face folder (checkpoint.export_format: hf) from the first module's
  // whole state (gathered from any strategy's pieces; names as the module's): called by finish()
  // on global rank 0 with that state and export_weights(). A program that trains a Hugging Face
  // architecture sets it (examples/gpt.cc: fabric::hf::save_llama / save_gpt2); without it,
  // export_format hf is a ConfigError at finish().
  using HfExport = std::function<void(const StateDict& whole, const std::filesystem::path& folder)>;
  void set_hf_export(HfExport write) { hf_export_ = std::move(write); }
  // The module finish() exports instead of the state's first module: one that is not in the
  // state (e.g. a LoRA model whose checkpoints hold only its adapters, examples/finetune.cc). It
  // must outlive the Checkpointer and be set up with Fabric.
  void set_export_module(torch::nn::Module& module) { export_module_ = &module; }
  // Saves now; returns the checkpoint's path. When a weight, buffer or optimizer parameter is not
  // finite on any rank, writes nothing (one warning line) and returns an empty path: a regular
  // checkpoint never holds NaN weights for resume: auto or a restart to pick (under
  // checkpoint.async the snapshot is checked in the background and the warning comes at the next
  // save). Collective.
  std::filesystem::path save();
  // Saves now as <dir>/<prefix>-step-NNNNNNNN.ckpt, outside rotation, `latest` and resume: auto
  // (e.g. "nonfinite": a diverged run's state, for inspection, never resumed from by accident).
  // Collective.
  std::filesystem::path save_aside(const std::string& prefix);

  // The complete checkpoints `resume: auto` would consider, newest first (for tests and tools).
  std::vector<std::filesystem::path> candidates() const;

 private:
  HfExport hf_export_;
  torch::nn::Module* export_module_ = nullptr;
  // candidates() written at or after `since` (all when nullopt).
  std::vector<std::filesystem::path> candidates_since(
      std::optional<std::chrono::system_clock::time_point> since) const;
  // The newest candidate since `since` that passes verify_checkpoint on rank 0 (damaged ones are
  // skipped with a warning naming `why`), on every rank; "" when none. Collective.
  std::string newest_verified(const std::string& why,
                              std::optional<std::chrono::system_clock::time_point> since);
  void resume(const std::string& configured);
  void load_from(const std::string& chosen);
  // A checkpoint folder belongs to one run: when dir_ holds checkpoints and this run did not
  // resume from one of them, a ConfigError naming checkpoint.dir (before anything is written).
  void claim_dir();
  void prepare_dir();         // rank 0: the folder exists, a killed save's temporary files are gone
  void remove_temporaries();  // rank 0: every *.tmp.* file and folder of the checkpoint folder
  void publish(const std::filesystem::path& path);  // rank 0: `latest`, then rotation
  // Waits for the background write, then throws its error on every rank (collective).
  void wait_for_write();
  bool state_is_finite();  // collective
  static std::string not_finite_warning(int64_t step);
  std::filesystem::path write(const std::string& file_name);
  Fabric& f_;
  CheckpointState state_;
  const CheckpointerOptions options_;
  const std::filesystem::path& dir_ = options_.dir;  // where this run's checkpoints go
  std::thread writer_;
  std::string write_error_, write_warning_;  // set by the writer thread; read after joining it
  std::shared_ptr<c10::IValue> snapshot_;    // the last async snapshot (rank 0), reused
  int64_t step_ = 0, epoch_ = 0, saved_step_ = -1, saved_epoch_ = -1;
  std::string resumed_from_;
  int64_t attempt_ = 0;
  bool export_skipped_ = false;  // finish() found the weights not finite
  const std::string no_export_;
};

// "step-00000120.ckpt" → 120; -1 for other names.
int64_t checkpoint_step(const std::string& file_name);

// The checkpoints (files and sharded folders named step-N.ckpt) in `dir`, oldest step first.
std::vector<std::filesystem::path> checkpoints_in(const std::filesystem::path& dir);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINTER_H_
