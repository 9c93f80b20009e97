// The launch schemes Fabric recognizes and how each is detected. detect_environment() tries them
// in this order and returns the first that matches:
//
//   1. torchelastic  TORCHELASTIC_RUN_ID set (torchrun --no-python ./binary ...): RANK, WORLD_SIZE,
//                    LOCAL_RANK, GROUP_RANK (node), MASTER_ADDR, MASTER_PORT.
//   2. slurm         SLURM_NTASKS and SLURM_PROCID set, and the job is not an interactive shell
//                    (SLURM_JOB_NAME bash/interactive): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//                    SLURM_NODEID; MASTER_ADDR, else the first host of SLURM_NODELIST (or
//                    SLURM_JOB_NODELIST); MASTER_PORT, else 15000 + the last four digits of
//                    SLURM_JOB_ID.
//   3. openmpi       OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE: plus
//                    OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE (node = rank /
//                    local size); MASTER_ADDR, else 127.0.0.1 when the job is on one node
//                    (OMPI_MCA_orte_num_nodes = 1) and an error naming `mpirun -x
//                    MASTER_ADDR=<host>` across nodes; MASTER_PORT, else 20000 +
//                    OMPI_MCA_ess_base_jobid % 12000 (the same for every rank of a job; below
//                    Linux's ephemeral ports).
//   4. mpich         PMI_RANK and PMI_SIZE: plus MPI_LOCALRANKID, MPI_LOCALNRANKS;
//                    MASTER_ADDR/MASTER_PORT required.
//   5. env           RANK and WORLD_SIZE (any launcher): LOCAL_RANK (default RANK), NODE_RANK or
//                    GROUP_RANK (default 0), MASTER_ADDR (default 127.0.0.1), MASTER_PORT required
//                    when WORLD_SIZE > 1.
//   6. local         none of the above: Fabric launches the processes itself (self-launch) on this
//                    machine. Its children carry FABRIC_LOCAL_RANK, FABRIC_WORLD_SIZE and
//                    FABRIC_MASTER_PORT, set by the launcher; under the restart agent also
//                    FABRIC_AGENT_STORE=1 (the agent hosts the store, keys under
//                    /attempt_<FABRIC_RESTART_COUNT>), fabric/distributed/restart_agent.h.
//
// Each also reports the processes on this machine (local_world_size): LOCAL_WORLD_SIZE (torchrun,
// env), SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE, OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS.
//
// Malformed values (a non-integer rank, a rank outside the world, a missing MASTER_PORT where it is
// required) throw fabric::Error naming the variable and its value.
#ifndef FABRIC_ENVIRONMENTS_ENVIRONMENTS_H_
#define FABRIC_ENVIRONMENTS_ENVIRONMENTS_H_

#include <memory>
#include <string>
#include <vector>

#include "fabric/core/cluster_environment.h"

namespace fabric {

// `local_world_size`: processes the self-launcher will start on this machine (scheme 6 only).
std::unique_ptr<ClusterEnvironment> detect_environment(const EnvGetter& env,
                                                       int64_t local_world_size);

// Tasks SLURM runs on node `node` according to SLURM_TASKS_PER_NODE ("2(x3),1" → 2 for nodes 0-2,
// 1 for node 3); 0 when the text does not say.
int64_t slurm_tasks_on_node(const std::string& tasks_per_node, int64_t node);

// The first host of a SLURM node list: "node[003-005,9],gpu1" → "node003".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace fabric

#endif  // FABRIC_ENVIRONMENTS_ENVIRONMENTS_H_
