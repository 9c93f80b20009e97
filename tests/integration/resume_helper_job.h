// A gtest fixture running //tests/integration:resume_helper jobs in a fresh temporary folder
// (the working directory of every job) and reading the checkpoints they write. Shared by the
// tests that compare strategies on the helper's conv net (zero_test, fsdp_test).
#ifndef TESTS_INTEGRATION_RESUME_HELPER_JOB_H_
#define TESTS_INTEGRATION_RESUME_HELPER_JOB_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <utility>

#include "fabric/checkpoint/sharded.h"
#include "tests/run_command.h"

namespace fabric::testing {

class ResumeHelperJob : public ::testing::Test {
 protected:
  // `defaults`: arguments every job of the test gets before its own (its own win).
  explicit ResumeHelperJob(std::string defaults) : defaults_(std::move(defaults)) {}
  void SetUp() override {
    std::string tmpl = (std::filesystem::path(::testing::TempDir()) / "job_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // 16 steps of batch 6 on CPU, SGD-or-whatever lr 0.01 with a cosine schedule, checkpoints only
  // when asked, runs under runs/{name}/{timestamp}; then `args`.
  CommandResult run(const std::string& args) { return run_with_env(args, ""); }
  // `env`: "NAME=VALUE ..." for the job's processes.
  CommandResult run_with_env(const std::string& args, const std::string& env) {
    const std::string exe = helper_binary("//tests/integration:resume_helper");
    return run_command(
        "cd '" + dir_.string() + "' && " + env + " '" + exe +
        "' fabric.accelerator=cpu fabric.ddp.timeout_s=60 optimizer.lr=0.01 "
        "scheduler.name=cosine trainer.max_steps=16 data.batch_size=6 data.num_workers=0 "
        "checkpoint.export_weights=none checkpoint.every_n_epochs=0 "
        "logging.run_dir=runs/{name}/{timestamp} " +
        defaults_ + " " + args);
  }

  // The "state" entry of a checkpoint (file or sharded folder) the helper wrote, and one entry.
  c10::IValue state(const std::string& file) {
    return read_checkpoint(dir_ / file).toGenericDict().at("state");
  }
  c10::IValue entry(const std::string& file, const std::string& name) {
    return state(file).toGenericDict().at(name);
  }

  std::filesystem::path dir_;

 private:
  std::string defaults_;
};

}  // namespace fabric::testing

#endif  // TESTS_INTEGRATION_RESUME_HELPER_JOB_H_
