// fabric::ClusterEnvironment: read-only facts about the job this process belongs to (world size,
// ranks, where rank 0's rendezvous store listens). One implementation per launch scheme, detected
// from environment variables (fabric/environments/detect.h). Variables are read through an
// EnvGetter so tests can simulate SLURM, torchrun or MPI without touching the real environment.
#ifndef FABRIC_CORE_CLUSTER_ENVIRONMENT_H_
#define FABRIC_CORE_CLUSTER_ENVIRONMENT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace fabric {

// Returns the value of an environment variable, or nullopt when it is unset.
using EnvGetter = std::function<std::optional<std::string>(const std::string& name)>;

// The real process environment (std::getenv).
EnvGetter process_environment();

class ClusterEnvironment {
 public:
  virtual ~ClusterEnvironment() = default;
  // "torchelastic", "slurm", "openmpi", "mpich", "env" (plain variables) or "local".
  virtual std::string name() const = 0;
  // True when another program (torchrun, srun, mpirun) started the processes; false when Fabric
  // itself spawns them (self-launch).
  virtual bool creates_processes_externally() const = 0;
  virtual int64_t world_size() const = 0;
  virtual int64_t global_rank() const = 0;
  virtual int64_t local_rank() const = 0;
  virtual int64_t node_rank() const = 0;
  // Processes of this job on this machine (torchrun LOCAL_WORLD_SIZE, SLURM tasks on this node,
  // OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS); 0 when the launcher does not say.
  virtual int64_t local_world_size() const = 0;
  // Address and port of rank 0's rendezvous store. Port 0: not chosen yet (a self-launched job
  // binds port 0 and hands the real port to its children).
  virtual std::string main_address() const = 0;
  virtual int main_port() const = 0;
  // The launcher already hosts the rendezvous store at main_address():main_port() and every rank,
  // rank 0 included, connects to it as a client: torchrun's agent does
  // (TORCHELASTIC_USE_AGENT_STORE=True). Default: false (rank 0 hosts it).
  virtual bool store_hosted_by_launcher() const { return false; }
  // Prefix of every key this job writes to the store ("" none). Under torchrun's agent store:
  // "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>", as PyTorch's workers use, so the keys of a
  // restarted attempt never meet the previous attempt's.
  virtual std::string store_prefix() const { return ""; }
};

}  // namespace fabric

#endif  // FABRIC_CORE_CLUSTER_ENVIRONMENT_H_
