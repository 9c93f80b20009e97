// A one-machine SLURM cluster for a test suite (tools/slurm_local.sh: munged, slurmctld and slurmd
// with everything in a temporary folder). Start it in SetUpTestSuite, stop it in
// TearDownTestSuite; in SetUp, skip with skip_reason() when slurm-wlm is missing (the only reason
// to skip) and fail with failure() when it is installed but did not start.
#ifndef TESTS_SLURM_CLUSTER_H_
#define TESTS_SLURM_CLUSTER_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "tests/run_command.h"

namespace fabric::testing {

class LocalSlurm {
 public:
  // Needs tools/slurm_local.sh in the test's runfiles; exports SLURM_CONF for the test's commands.
  void start() {
    char tmpl[] = "/tmp/fabric_slurm_XXXXXX";  // short: munge's socket path must fit 108 bytes
    dir_ = mkdtemp(tmpl);
    const auto r = run_command("tools/slurm_local.sh start " + dir_ + " 2>&1");
    started_ = r.code == 0;
    missing_ = r.code == 77;
    why_ = missing_ ? "slurm-wlm is not installed (tools/setup.sh installs it)"
                    : "tools/slurm_local.sh start failed (exit " + std::to_string(r.code) +
                          "): " + r.out;
    setenv("SLURM_CONF", (dir_ + "/slurm.conf").c_str(), 1);
  }
  void stop() {
    if (dir_.empty()) return;
    run_command("tools/slurm_local.sh stop " + dir_ + " 2>&1");
    std::filesystem::remove_all(dir_);
    unsetenv("SLURM_CONF");
    dir_.clear();
  }
  bool missing() const { return missing_; }
  bool started() const { return started_; }
  const std::string& why() const { return why_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, why_;
  bool started_ = false, missing_ = false;
};

}  // namespace fabric::testing

#endif  // TESTS_SLURM_CLUSTER_H_
