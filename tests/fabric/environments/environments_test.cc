#include "fabric/environments/environments.h"

#include <gtest/gtest.h>

#include <map>

#include "fabric/core/error.h"

namespace {

using Vars = std::map<std::string, std::string>;

fabric::EnvGetter fake(Vars vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

struct Row {
  std::string label;
  Vars vars;
  std::string name;
  bool external;
  int64_t world, rank, local_rank, node_rank;
  std::string address;
  int port;
};

TEST(EnvironmentsTest, DetectionTable) {
  const std::vector<Row> table = {
      {"torchrun",
       {{"TORCHELASTIC_RUN_ID", "abc"},
        {"RANK", "5"},
        {"WORLD_SIZE", "8"},
        {"LOCAL_RANK", "1"},
        {"GROUP_RANK", "2"},
        {"MASTER_ADDR", "10.0.0.1"},
        {"MASTER_PORT", "29400"},
        {"SLURM_NTASKS", "8"},
        {"SLURM_PROCID", "0"}},  // torchrun inside a SLURM job wins
       "torchelastic",
       true,
       8,
       5,
       1,
       2,
       "10.0.0.1",
       29400},
      {"slurm with node list",
       {{"SLURM_NTASKS", "4"},
        {"SLURM_PROCID", "3"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_NODEID", "1"},
        {"SLURM_NODELIST", "gpu[007-008]"},
        {"SLURM_JOB_ID", "1234567"}},
       "slurm",
       true,
       4,
       3,
       1,
       1,
       "gpu007",
       15000 + 4567},
      {"slurm with MASTER_ADDR/PORT",
       {{"SLURM_NTASKS", "2"},
        {"SLURM_PROCID", "0"},
        {"MASTER_ADDR", "head"},
        {"MASTER_PORT", "1234"},
        {"SLURM_JOB_NAME", "train"}},
       "slurm",
       true,
       2,
       0,
       0,
       0,
       "head",
       1234},
      {"openmpi",
       {{"OMPI_COMM_WORLD_RANK", "6"},
        {"OMPI_COMM_WORLD_SIZE", "8"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
        {"MASTER_ADDR", "n0"},
        {"MASTER_PORT", "4000"}},
       "openmpi",
       true,
       8,
       6,
       2,
       1,
       "n0",
       4000},
      {"mpich",
       {{"PMI_RANK", "1"},
        {"PMI_SIZE", "2"},
        {"MPI_LOCALRANKID", "1"},
        {"MPI_LOCALNRANKS", "2"},
        {"MASTER_PORT", "4001"}},
       "mpich",
       true,
       2,
       1,
       1,
       0,
       "127.0.0.1",
       4001},
      {"plain variables",
       {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "host"}, {"MASTER_PORT", "5000"}},
       "env",
       true,
       2,
       1,
       1,
       0,
       "host",
       5000},
      {"self-launch parent", {}, "local", false, 3, 0, 0, 0, "127.0.0.1", 0},
      {"self-launch child",
       {{"FABRIC_LOCAL_RANK", "2"}, {"FABRIC_WORLD_SIZE", "3"}, {"FABRIC_MASTER_PORT", "41234"}},
       "local",
       false,
       3,
       2,
       2,
       0,
       "127.0.0.1",
       41234},
      {"interactive SLURM shell is not a launch",
       {{"SLURM_NTASKS", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_JOB_NAME", "bash"}},
       "local",
       false,
       3,
       0,
       0,
       0,
       "127.0.0.1",
       0},
  };
  for (const auto& row : table) {
    auto e = fabric::detect_environment(fake(row.vars), 3);
    EXPECT_EQ(e->name(), row.name) << row.label;
    EXPECT_EQ(e->creates_processes_externally(), row.external) << row.label;
    EXPECT_EQ(e->world_size(), row.world) << row.label;
    EXPECT_EQ(e->global_rank(), row.rank) << row.label;
    EXPECT_EQ(e->local_rank(), row.local_rank) << row.label;
    EXPECT_EQ(e->node_rank(), row.node_rank) << row.label;
    EXPECT_EQ(e->main_address(), row.address) << row.label;
    EXPECT_EQ(e->main_port(), row.port) << row.label;
  }
}

std::string error_of(Vars vars) {
  try {
    fabric::detect_environment(fake(std::move(vars)), 1);
  } catch (const fabric::Error& e) {
    return e.what();
  }
  return "";
}

// mpirun gives no address or port: one node defaults to loopback and a port from mpirun's job id
// (the same on every rank); across nodes MASTER_ADDR must be passed, and the error says how.
TEST(EnvironmentsTest, OpenMpiDefaultsOnOneNodeAndNamesTheFixAcrossNodes) {
  const Vars one_node = {{"OMPI_COMM_WORLD_RANK", "1"},
                         {"OMPI_COMM_WORLD_SIZE", "2"},
                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                         {"OMPI_MCA_orte_num_nodes", "1"},
                         {"OMPI_MCA_ess_base_jobid", "1970339841"}};
  const auto env = fabric::detect_environment(fake(one_node), 2);
  EXPECT_EQ(env->main_address(), "127.0.0.1");
  EXPECT_EQ(env->main_port(), 20000 + 1970339841 % 12000);  // below the ephemeral ports
  EXPECT_LT(env->main_port(), 32768);
  Vars two_nodes = one_node;
  two_nodes["OMPI_MCA_orte_num_nodes"] = "2";
  two_nodes["OMPI_COMM_WORLD_LOCAL_SIZE"] = "1";
  EXPECT_EQ(error_of(two_nodes),
            "OpenMPI launch across 2 nodes: MASTER_ADDR is not set; pass rank 0's host name or "
            "address to every rank (mpirun -x MASTER_ADDR=<host> ...)");
  two_nodes["MASTER_ADDR"] = "n0";
  EXPECT_EQ(fabric::detect_environment(fake(two_nodes), 2)->main_address(), "n0");
}

TEST(EnvironmentsTest, BadValuesNameTheVariable) {
  EXPECT_EQ(error_of({{"RANK", "one"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}),
            "RANK/WORLD_SIZE launch: RANK='one' is not an integer");
  EXPECT_EQ(error_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}}),
            "RANK/WORLD_SIZE launch: MASTER_PORT is not set");
  EXPECT_EQ(
      error_of(
          {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}),
      "OpenMPI launch: MASTER_PORT=70000 is not a port (1-65535)");
  EXPECT_EQ(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}),
            "env launch: rank 2 (local 2, node 0) does not fit a world of 2");
  EXPECT_EQ(error_of({{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "0"}}),
            "SLURM launch: neither MASTER_ADDR nor SLURM_NODELIST is set");
}

// How many ranks run on this machine, as each launcher says it (0: not said). The thread budget
// divides the CPUs by it.
TEST(EnvironmentsTest, LocalWorldSizeComesFromEachLauncher) {
  const std::vector<std::pair<Vars, int64_t>> table = {
      {{{"TORCHELASTIC_RUN_ID", "a"},
        {"RANK", "0"},
        {"WORLD_SIZE", "8"},
        {"LOCAL_RANK", "0"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"MASTER_PORT", "1"}},
       4},
      {{{"SLURM_NTASKS", "6"},
        {"SLURM_PROCID", "5"},
        {"SLURM_NODEID", "1"},
        {"SLURM_TASKS_PER_NODE", "4,2"},
        {"SLURM_NODELIST", "n1"}},
       2},
      {{{"SLURM_NTASKS", "6"},
        {"SLURM_PROCID", "0"},
        {"SLURM_NTASKS_PER_NODE", "3"},
        {"SLURM_TASKS_PER_NODE", "4,2"},
        {"SLURM_NODELIST", "n1"}},
       3},
      {{{"OMPI_COMM_WORLD_RANK", "0"},
        {"OMPI_COMM_WORLD_SIZE", "4"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
        {"MASTER_ADDR", "n0"},
        {"MASTER_PORT", "1"}},
       2},
      {{{"PMI_RANK", "0"}, {"PMI_SIZE", "4"}, {"MPI_LOCALNRANKS", "4"}, {"MASTER_PORT", "1"}}, 4},
      {{{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"MASTER_PORT", "1"}}, 0},
      {{}, 3},  // self-launch: every process is on this machine
  };
  for (const auto& [vars, want] : table) {
    EXPECT_EQ(fabric::detect_environment(fake(vars), 3)->local_world_size(), want)
        << fabric::detect_environment(fake(vars), 3)->name();
  }
  EXPECT_EQ(fabric::slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(fabric::slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(fabric::slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(fabric::slurm_tasks_on_node("2(x3),1", 4), 0);
  EXPECT_EQ(fabric::slurm_tasks_on_node("garbage", 0), 0);
  EXPECT_EQ(fabric::slurm_tasks_on_node("2(x", 0), 0);
}

// torchrun's agent hosts the store and says so: ranks connect as clients, under the attempt's
// prefix (a restarted attempt never reads the previous one's keys). Other launchers: rank 0 hosts.
TEST(EnvironmentsTest, TorchrunAgentStoreIsUsedAsAClientUnderTheAttemptPrefix) {
  const Vars torchrun = {{"TORCHELASTIC_RUN_ID", "a"},
                         {"RANK", "0"},
                         {"WORLD_SIZE", "2"},
                         {"LOCAL_RANK", "0"},
                         {"MASTER_PORT", "29500"}};
  Vars agent = torchrun;
  agent["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  agent["TORCHELASTIC_RESTART_COUNT"] = "2";
  const auto with_agent = fabric::detect_environment(fake(agent), 2);
  EXPECT_TRUE(with_agent->store_hosted_by_launcher());
  EXPECT_EQ(with_agent->store_prefix(), "/worker/attempt_2");
  agent["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(fabric::detect_environment(fake(agent), 2)->store_hosted_by_launcher());
  const auto without = fabric::detect_environment(fake(torchrun), 2);
  EXPECT_FALSE(without->store_hosted_by_launcher());
  EXPECT_EQ(without->store_prefix(), "");
  EXPECT_FALSE(fabric::detect_environment(fake({}), 2)->store_hosted_by_launcher());
}

TEST(EnvironmentsTest, FirstSlurmHost) {
  EXPECT_EQ(fabric::first_slurm_host("node1"), "node1");
  EXPECT_EQ(fabric::first_slurm_host("node1,node2"), "node1");
  EXPECT_EQ(fabric::first_slurm_host("gpu[003-005,9]"), "gpu003");
  EXPECT_EQ(fabric::first_slurm_host("gpu[12,14]"), "gpu12");
  EXPECT_EQ(fabric::first_slurm_host("login1,gpu[1-2]"), "login1");
}

}  // namespace
