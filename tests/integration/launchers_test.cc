// Real launchers starting Fabric ranks, each compared with the self-launched job (same trained
// parameters, by hash, of ddp_parity_helper's MLP; rank 0's parity check against one process).
//
// torchrun (torch.distributed.run of the pinned torch wheel): its agent
// hosts the rendezvous store (TORCHELASTIC_USE_AGENT_STORE=True) and every rank connects to it as
// a client under the attempt's key prefix. One agent (--standalone) and two agents on loopback
// (c10d rendezvous) train ddp_parity_helper's MLP to the very same parameters (hash) as the
// self-launched job, and rank 0's parity check against one process passes. A killed rank ends
// the job non-zero with the rank named; with --max-restarts the restarted attempt trains to the
// same parameters.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/run_command.h"
#include "tests/slurm_cluster.h"

namespace {

using fabric::testing::run_command;
using fabric::testing::value_after;

std::string helper() {
  return fabric::testing::helper_binary("//tests/integration:ddp_parity_helper");
}

std::string torchrun() {
  return fabric::testing::python_interpreter() + " -m torch.distributed.run";
}

// The self-launched job's parameter hash, the reference every launcher must reproduce.
std::string self_launched_hash() {
  static const std::string hash = [] {
    const auto self = run_command(helper() + " 2 4 plain 2>&1");
    EXPECT_EQ(self.code, 0) << self.out;
    return value_after(self.out, "params_hash=");
  }();
  return hash;
}

class TorchrunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto probe = run_command(fabric::testing::python_interpreter() +
                                   " -c 'import torch.distributed.run' 2>&1");
    if (probe.code != 0)
      GTEST_SKIP() << "no torch.distributed.run for " << fabric::testing::python_interpreter()
                   << " (tools/setup.sh installs torch): " << probe.out;
    self_hash_ = self_launched_hash();
    ASSERT_FALSE(self_hash_.empty());
  }
  std::string self_hash_;
};

// mpirun (Debian's OpenMPI, openmpi-bin): ranks read OMPI_COMM_WORLD_*; on one node the store
// address defaults to loopback and the port to one derived from mpirun's job id.
class MpirunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (run_command("command -v mpirun >/dev/null 2>&1").code != 0)
      GTEST_SKIP() << "no mpirun on PATH (tools/setup.sh installs Debian's openmpi-bin)";
    self_hash_ = self_launched_hash();
    ASSERT_FALSE(self_hash_.empty());
  }
  // --allow-run-as-root: CI runs as root; --oversubscribe: 2 ranks may exceed the slots OpenMPI
  // counts on a small machine.
  const std::string mpirun_ = "timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 ";
  std::string self_hash_;
};

TEST_F(MpirunTest, TwoRanksTrainLikeTheSelfLaunchedJobWithoutAnyAddressGiven) {
  const auto r = run_command(mpirun_ + helper() + " 2 4 plain 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(value_after(r.out, "params_hash="), self_hash_) << r.out;
}

TEST_F(MpirunTest, AKilledRankEndsTheJobWithAnErrorNamingIt) {
  const auto r =
      run_command(mpirun_ + "-x FABRIC_TEST_KILL_RANK=1 " + helper() + " 2 4 plain 2>&1");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "timed out: " << r.out;
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("signal 9"), std::string::npos) << r.out;
}

TEST_F(TorchrunTest, OneAgentTrainsLikeTheSelfLaunchedJob) {
  const auto r = run_command(torchrun() + " --standalone --nproc-per-node=2 --no-python " +
                             helper() + " 2 4 plain 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(value_after(r.out, "params_hash="), self_hash_) << r.out;
  EXPECT_EQ(r.out.find("cannot host the rendezvous store"), std::string::npos) << r.out;
}

TEST_F(TorchrunTest, TwoAgentsOnLoopbackTrainLikeTheSelfLaunchedJob) {
  const std::string common =
      " --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:" +
      std::to_string(fabric::testing::free_loopback_port()) + " --no-python " + helper() +
      " 2 4 plain";
  // With c10d rendezvous the agents' order of arrival decides the node ranks: keep both outputs.
  const std::string other = (std::filesystem::path(::testing::TempDir()) / "agent_b.log").string();
  const auto r =
      run_command("(" + torchrun() + common + " >" + other + " 2>&1 & " + torchrun() + common +
                  "; a=$?; wait $!; b=$?; cat " + other + "; [ $a -eq 0 ] && [ $b -eq 0 ]) 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(value_after(r.out, "params_hash="), self_hash_) << r.out;
}

// A rank killed (SIGKILL) in the middle of the job: torchrun stops the other rank and exits
// non-zero, naming the killed rank; a hang would hit the 120 s timeout instead.
TEST_F(TorchrunTest, AKilledRankEndsTheJobWithAnErrorNamingIt) {
  const auto r =
      run_command("FABRIC_TEST_KILL_RANK=1 timeout 120 " + torchrun() +
                  " --standalone --nproc-per-node=2 --no-python " + helper() + " 2 4 plain 2>&1");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "timed out: " << r.out;
  EXPECT_NE(r.out.find("local_rank: 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Signal 9 (SIGKILL)"), std::string::npos) << r.out;
}

// --max-restarts: after the kill torchrun restarts both workers (attempt 1; its keys go under
// /worker/attempt_1 as PyTorch's workers' do, though this job also passed without the prefix),
// and the restarted job trains to the self-launched job's parameters.
TEST_F(TorchrunTest, MaxRestartsRestartsTheWorkersAfterAKilledRank) {
  const auto r = run_command("FABRIC_TEST_KILL_RANK=1 timeout 120 " + torchrun() +
                             " --standalone --nproc-per-node=2 --max-restarts=1 --no-python " +
                             helper() + " 2 4 plain 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(value_after(r.out, "params_hash="), self_hash_) << r.out;
}

// SLURM (Debian's slurm-wlm): a one-machine cluster (tools/slurm_local.sh: munged, slurmctld and
// slurmd with everything in a temporary folder), then srun and an sbatch script as a user runs
// them. Ranks read SLURM_PROCID/SLURM_NTASKS; the store address is the first host of the node list
// and its port comes from the job id.
class SlurmTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { cluster_.start(); }
  static void TearDownTestSuite() { cluster_.stop(); }
  void SetUp() override {
    if (cluster_.missing()) GTEST_SKIP() << cluster_.why();
    ASSERT_TRUE(cluster_.started()) << cluster_.why();
    self_hash_ = self_launched_hash();
    ASSERT_FALSE(self_hash_.empty());
  }
  static inline fabric::testing::LocalSlurm cluster_;
  std::string self_hash_;
};

TEST_F(SlurmTest, SrunTrainsLikeTheSelfLaunchedJob) {
  const auto r = run_command("timeout 120 srun -N1 -n2 " + helper() + " 2 4 plain 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(value_after(r.out, "params_hash="), self_hash_) << r.out;
}

TEST_F(SlurmTest, AnSbatchScriptTrainsLikeTheSelfLaunchedJob) {
  const std::string script = cluster_.dir() + "/job.sh";
  std::ofstream(script) << "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks=2\n#SBATCH --output="
                        << cluster_.dir() << "/job.out\nsrun " << helper() << " 2 4 plain\n";
  const auto r = run_command("timeout 120 sbatch --wait " + script + " 2>&1; cat " +
                             cluster_.dir() + "/job.out");
  EXPECT_NE(r.out.find("Submitted batch job"), std::string::npos) << r.out;
  EXPECT_EQ(value_after(r.out, "params_hash="), self_hash_) << r.out;
}

TEST_F(SlurmTest, AKilledRankEndsTheJobWithAnErrorNamingIt) {
  const auto r = run_command("FABRIC_TEST_KILL_RANK=1 timeout 120 srun -N1 -n2 " + helper() +
                             " 2 4 plain 2>&1");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "timed out: " << r.out;
  EXPECT_NE(r.out.find("task 1: Killed"), std::string::npos) << r.out;
}

}  // namespace
