#include "fabric/environments/environments.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <sstream>

#include "fabric/core/error.h"

namespace fabric {

EnvGetter process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

namespace {

// Reads variables of one scheme, with errors that name the variable and its value.
class Vars {
 public:
  Vars(const EnvGetter& env, std::string scheme) : env_(env), scheme_(std::move(scheme)) {}

  bool has(const std::string& name) const { return env_(name).has_value(); }

  std::string text(const std::string& name, const std::string& fallback) const {
    return env_(name).value_or(fallback);
  }

  int64_t integer(const std::string& name) const {
    auto v = env_(name);
    if (!v) throw Error(scheme_ + " launch: " + name + " is not set");
    return parse(name, *v);
  }

  int64_t integer(const std::string& name, int64_t fallback) const {
    auto v = env_(name);
    return v ? parse(name, *v) : fallback;
  }

  int port(const std::string& name) const {
    const int64_t p = integer(name);
    if (p < 1 || p > 65535)
      throw Error(scheme_ + " launch: " + name + "=" + std::to_string(p) +
                  " is not a port (1-65535)");
    return static_cast<int>(p);
  }

 private:
  int64_t parse(const std::string& name, const std::string& value) const {
    int64_t out = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
    if (ec != std::errc() || end != value.data() + value.size() || value.empty())
      throw Error(scheme_ + " launch: " + name + "='" + value + "' is not an integer");
    return out;
  }
  const EnvGetter& env_;
  std::string scheme_;
};

class Environment : public ClusterEnvironment {
 public:
  struct Facts {
    std::string name;
    bool external = true;
    int64_t world = 1, rank = 0, local_rank = 0, node_rank = 0;
    std::string address = "127.0.0.1";
    int port = 0;
    int64_t local_world = 0;  // 0: unknown
    bool launcher_store = false;
    std::string store_prefix;
  };
  explicit Environment(Facts f) : f_(std::move(f)) {
    if (f_.world < 1 || f_.rank < 0 || f_.rank >= f_.world || f_.local_rank < 0 ||
        f_.node_rank < 0) {
      throw Error(f_.name + " launch: rank " + std::to_string(f_.rank) + " (local " +
                  std::to_string(f_.local_rank) + ", node " + std::to_string(f_.node_rank) +
                  ") does not fit a world of " + std::to_string(f_.world));
    }
  }
  std::string name() const override { return f_.name; }
  bool creates_processes_externally() const override { return f_.external; }
  int64_t world_size() const override { return f_.world; }
  int64_t global_rank() const override { return f_.rank; }
  int64_t local_rank() const override { return f_.local_rank; }
  int64_t node_rank() const override { return f_.node_rank; }
  int64_t local_world_size() const override { return f_.local_world; }
  std::string main_address() const override { return f_.address; }
  int main_port() const override { return f_.port; }
  bool store_hosted_by_launcher() const override { return f_.launcher_store; }
  std::string store_prefix() const override { return f_.store_prefix; }

 private:
  Facts f_;
};

std::unique_ptr<ClusterEnvironment> make(Environment::Facts f) {
  return std::make_unique<Environment>(std::move(f));
}

}  // namespace

int64_t slurm_tasks_on_node(const std::string& tasks_per_node, int64_t node) {
  // "2(x3),1": nodes 0-2 run 2 tasks, node 3 runs 1.
  int64_t first = 0;
  std::istringstream groups(tasks_per_node);
  std::string group;
  while (std::getline(groups, group, ',')) {
    int64_t tasks = 0, repeat = 1;
    const char* p = group.c_str();
    auto [end, ec] = std::from_chars(p, p + group.size(), tasks);
    if (ec != std::errc()) return 0;
    if (end != p + group.size()) {
      if (std::string(end).rfind("(x", 0) != 0) return 0;
      auto [end2, ec2] = std::from_chars(end + 2, p + group.size(), repeat);
      if (ec2 != std::errc() || *end2 != ')') return 0;
    }
    if (node < first + repeat) return tasks;
    first += repeat;
  }
  return 0;
}

std::string first_slurm_host(const std::string& nodelist) {
  const std::string first = nodelist.substr(0, nodelist.find(','));
  const size_t open = nodelist.find('[');
  if (open == std::string::npos || open > first.size()) return first;
  // "prefix[003-005,9]..." → prefix + first number of the range (keeping its zero padding).
  const std::string prefix = nodelist.substr(0, open);
  const size_t end = nodelist.find_first_of("-,]", open + 1);
  return prefix + nodelist.substr(open + 1, end - open - 1);
}

std::unique_ptr<ClusterEnvironment> detect_environment(const EnvGetter& env,
                                                       int64_t local_world_size) {
  if (env("TORCHELASTIC_RUN_ID")) {
    Vars v(env, "torchrun");
    // torchrun's agent hosts the store on MASTER_PORT and says so ("True", the value PyTorch's
    // own workers compare with); workers connect as clients.
    const bool agent_store = v.text("TORCHELASTIC_USE_AGENT_STORE", "") == "True";
    return make(
        {"torchelastic", true, v.integer("WORLD_SIZE"), v.integer("RANK"), v.integer("LOCAL_RANK"),
         v.integer("GROUP_RANK", 0), v.text("MASTER_ADDR", "127.0.0.1"), v.port("MASTER_PORT"),
         v.integer("LOCAL_WORLD_SIZE", 0), agent_store,
         agent_store
             ? "/worker/attempt_" + std::to_string(v.integer("TORCHELASTIC_RESTART_COUNT", 0))
             : std::string()});
  }
  const std::string job_name = env("SLURM_JOB_NAME").value_or("");
  if (env("SLURM_NTASKS") && env("SLURM_PROCID") && job_name != "bash" &&
      job_name != "interactive") {
    Vars v(env, "SLURM");
    std::string address = v.text("MASTER_ADDR", "");
    if (address.empty()) {
      const std::string nodes = v.text("SLURM_NODELIST", v.text("SLURM_JOB_NODELIST", ""));
      if (nodes.empty()) throw Error("SLURM launch: neither MASTER_ADDR nor SLURM_NODELIST is set");
      address = first_slurm_host(nodes);
    }
    int port = 0;
    if (v.has("MASTER_PORT")) {
      port = v.port("MASTER_PORT");
    } else {
      const std::string job = std::to_string(v.integer("SLURM_JOB_ID", 0));
      port =
          15000 + static_cast<int>(std::stoll(job.size() > 4 ? job.substr(job.size() - 4) : job));
    }
    const int64_t node = v.integer("SLURM_NODEID", 0);
    int64_t local_world = v.integer("SLURM_NTASKS_PER_NODE", 0);
    if (local_world == 0)
      local_world = slurm_tasks_on_node(v.text("SLURM_TASKS_PER_NODE", ""), node);
    return make({"slurm", true, v.integer("SLURM_NTASKS"), v.integer("SLURM_PROCID"),
                 v.integer("SLURM_LOCALID", 0), node, address, port, local_world});
  }
  if (env("OMPI_COMM_WORLD_RANK") && env("OMPI_COMM_WORLD_SIZE")) {
    Vars v(env, "OpenMPI");
    const int64_t rank = v.integer("OMPI_COMM_WORLD_RANK");
    const int64_t local_world = v.integer("OMPI_COMM_WORLD_LOCAL_SIZE", 0);
    const int64_t local_size = std::max<int64_t>(local_world, 1);
    const int64_t world = v.integer("OMPI_COMM_WORLD_SIZE");
    // mpirun says nothing of rank 0's address: on one node it is loopback; across nodes the user
    // names it (mpirun -x MASTER_ADDR=host). The port defaults to one derived from mpirun's job
    // id, which every rank of the job sees alike, in [20000, 32000): below Linux's ephemeral
    // range (32768-60999), where the kernel picks ports for outgoing connections and port-0
    // listeners, so another process's connection cannot hold it (it did once in CI: a derived
    // 34753 was in use).
    int port = 0;
    if (v.has("MASTER_PORT") || !v.has("OMPI_MCA_ess_base_jobid")) {
      port = v.port("MASTER_PORT");  // names a bad or missing value
    } else {
      port = 20000 + static_cast<int>(v.integer("OMPI_MCA_ess_base_jobid") % 12000);
    }
    const int64_t nodes = v.integer("OMPI_MCA_orte_num_nodes", local_world >= world ? 1 : 0);
    if (!v.has("MASTER_ADDR") && nodes != 1)
      throw Error("OpenMPI launch across " +
                  (nodes > 1 ? std::to_string(nodes) : std::string("several")) +
                  " nodes: MASTER_ADDR is not set; pass rank 0's host name or address to every "
                  "rank (mpirun -x MASTER_ADDR=<host> ...)");
    return make({"openmpi", true, world, rank, v.integer("OMPI_COMM_WORLD_LOCAL_RANK", 0),
                 rank / local_size, v.text("MASTER_ADDR", "127.0.0.1"), port, local_world});
  }
  if (env("PMI_RANK") && env("PMI_SIZE")) {
    Vars v(env, "MPICH");
    const int64_t rank = v.integer("PMI_RANK");
    const int64_t local_world = v.integer("MPI_LOCALNRANKS", 0);
    const int64_t local_size = std::max<int64_t>(local_world, 1);
    return make({"mpich", true, v.integer("PMI_SIZE"), rank, v.integer("MPI_LOCALRANKID", 0),
                 rank / local_size, v.text("MASTER_ADDR", "127.0.0.1"), v.port("MASTER_PORT"),
                 local_world});
  }
  if (env("RANK") && env("WORLD_SIZE")) {
    Vars v(env, "RANK/WORLD_SIZE");
    const int64_t world = v.integer("WORLD_SIZE");
    const int64_t rank = v.integer("RANK");
    return make({"env", true, world, rank, v.integer("LOCAL_RANK", rank),
                 v.integer("NODE_RANK", v.integer("GROUP_RANK", 0)),
                 v.text("MASTER_ADDR", "127.0.0.1"),
                 world > 1 || v.has("MASTER_PORT") ? v.port("MASTER_PORT") : 0,
                 v.integer("LOCAL_WORLD_SIZE", 0)});
  }
  // Self-launch: the parent is rank 0 (no variables); its children carry FABRIC_* variables.
  Vars v(env, "self");
  const int64_t world = v.integer("FABRIC_WORLD_SIZE", local_world_size);
  const int64_t rank = v.integer("FABRIC_LOCAL_RANK", 0);
  // Under the restart agent (fabric/distributed/restart_agent.h) the agent hosts the store and each
  // attempt keeps its keys apart.
  const bool agent_store = v.text("FABRIC_AGENT_STORE", "") == "1";
  return make({"local", false, world, rank, rank, 0, "127.0.0.1",
               static_cast<int>(v.integer("FABRIC_MASTER_PORT", 0)), world, agent_store,
               agent_store ? "/attempt_" + std::to_string(v.integer("FABRIC_RESTART_COUNT", 0))
                           : std::string()});
}

}  // namespace fabric
