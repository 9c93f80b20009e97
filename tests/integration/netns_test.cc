// Multi-node over real TCP (issue 7): two network namespaces joined by a veth pair are two
// "nodes"; 2 ranks in each rendezvous over the veth addresses (store on node 0's address, Gloo on
// the veth interfaces, GLOO_SOCKET_IFNAME) and train K DDP steps. The trained parameters must be
// bitwise those of 4 ranks on one host, and match one process on the whole batch.
// Needs root and iproute2 (`ip netns`); skipped with the reason otherwise. Tag: netns.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

using fabric::testing::value_after;

constexpr const char* kSteps = "5";

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class NetnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string id = std::to_string(getpid() % 100000);
    ns_ = {"fabns" + id + "a", "fabns" + id + "b"};
    veth_ = {"fv" + id + "a", "fv" + id + "b"};
    std::string tmpl = (fs::path(::testing::TempDir()) / "netns_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override {
    for (const auto& ns : ns_) fabric::testing::run_command("ip netns del " + ns);  // veth too
    fs::remove_all(dir_);
  }
  // Creates the two namespaces and the veth pair; "" or why not.
  std::string make_nodes() {
    if (geteuid() != 0) return "not root: network namespaces need CAP_SYS_ADMIN";
    const std::string script =
        "set -e; ip netns add " + ns_[0] + "; ip netns add " + ns_[1] + "; ip link add " +
        veth_[0] + " netns " + ns_[0] + " type veth peer name " + veth_[1] + " netns " + ns_[1] +
        "; ip -n " + ns_[0] + " addr add 10.213.0.1/24 dev " + veth_[0] + "; ip -n " + ns_[1] +
        " addr add 10.213.0.2/24 dev " + veth_[1] + "; for n in " + ns_[0] + " " + ns_[1] +
        "; do ip -n $n link set lo up; done; ip -n " + ns_[0] + " link set " + veth_[0] +
        " up; ip -n " + ns_[1] + " link set " + veth_[1] + " up";
    const auto r = fabric::testing::run_command(script);
    return r.code == 0 ? "" : "cannot create network namespaces here: " + r.out;
  }
  fs::path dir_;
  std::vector<std::string> ns_, veth_;
};

TEST_F(NetnsTest, TwoNodesOfTwoRanksEqualFourRanksOnOneHost) {
  const std::string why = make_nodes();
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string helper =
      fabric::testing::helper_binary("//tests/integration:ddp_parity_helper");

  // 4 ranks on one host (self-launched) on Gloo, as the nodes below: the reference bits. (Both
  // pin Gloo: network namespaces share /dev/shm, so auto would pick shared memory, which sums in
  // another order and would not exercise Gloo over veth.)
  const auto local = fabric::testing::run_command(helper + " 4 " + kSteps + " plain gloo");
  ASSERT_EQ(local.code, 0) << local.out;
  const std::string expected = value_after(local.out, "params_hash=");
  ASSERT_FALSE(expected.empty()) << local.out;

  // Node r holds ranks 2r and 2r+1; rank 0's node hosts the store at 10.213.0.1.
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 4; ++rank) {
    const int node = rank / 2;
    const std::string out = (dir_ / ("rank" + std::to_string(rank))).string();
    const std::string cmd =
        "exec ip netns exec " + ns_[static_cast<size_t>(node)] +
        " env RANK=" + std::to_string(rank) + " LOCAL_RANK=" + std::to_string(rank % 2) +
        " NODE_RANK=" + std::to_string(node) +
        " WORLD_SIZE=4 MASTER_ADDR=10.213.0.1 MASTER_PORT=29555 GLOO_SOCKET_IFNAME=" +
        veth_[static_cast<size_t>(node)] + " " + helper + " 4 " + kSteps + " plain gloo >" + out +
        " 2>&1";
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
      _exit(127);
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::vector<int> status(4, -1);
  for (size_t i = 0; i < pids.size(); ++i) {
    while (waitpid(pids[i], &status[i], WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids) kill(p, SIGKILL);
        waitpid(pids[i], &status[i], 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::string all;
  for (int r = 0; r < 4; ++r)
    all += "--- rank " + std::to_string(r) + "\n" + read(dir_ / ("rank" + std::to_string(r)));
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(WIFEXITED(status[static_cast<size_t>(r)]) &&
                WEXITSTATUS(status[static_cast<size_t>(r)]) == 0)
        << "rank " << r << "\n"
        << all;
  const std::string rank0 = read(dir_ / "rank0");
  EXPECT_EQ(value_after(rank0, "params_hash="), expected) << all;
  std::printf("2 nodes x 2 ranks over veth: params_hash=%s (4 ranks on one host: %s), %s\n",
              value_after(rank0, "params_hash=").c_str(), expected.c_str(),
              ("max_rel_diff=" + value_after(rank0, "max_rel_diff=")).c_str());
}

}  // namespace
