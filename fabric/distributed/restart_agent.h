// fabric::run_restart_agent: a self-launched job that heals itself (fabric.max_restarts > 0).
//
// The process the user started becomes the job's supervisor instead of its rank 0: it hosts the
// rendezvous store and starts every rank, 0 included, as a child (SubprocessLauncher, first_rank 0)
// with, besides the usual FABRIC_LOCAL_RANK/WORLD_SIZE/MASTER_PORT:
//   FABRIC_AGENT_STORE=1       the store is the agent's; each attempt's keys live under
//                              /attempt_<n>, so an attempt never meets its predecessor's keys
//   FABRIC_RESTART_COUNT=n     0 for the first start
//   FABRIC_JOB_START_NS        when the job began: a restart resumes only from checkpoints newer
//   FABRIC_FAILED_STEP         the furthest step the failed attempt reached (restarts only)
//   FABRIC_PROGRESS_FD         the shared page of job_progress.h
// Ranks of such a job also run the heartbeat (fabric.ddp.heartbeat_timeout_s), so a frozen rank
// becomes a failing one.
//
// When any rank fails (a signal, a non-zero exit, a heartbeat loss, which makes the others exit 1)
// the agent stops the others (SIGTERM, SIGKILL after the grace period), prints
//   fabric: restart 1 of 3 in 1.0 s (fabric.max_restarts): rank 1 was killed by signal 9 (Killed)
//   after step 57; every rank resumes from the newest complete checkpoint of this job
// waits the back-off and starts every rank again; the Checkpointer of a restarted attempt resumes
// (fabric/checkpointer.h). Not restarted: exit status 2 (a configuration error would repeat),
// 3 (the loss diverged: a result, not a failure) and a rank ended by SIGINT (Ctrl-C); SIGINT or
// SIGTERM to the agent stops every rank and ends the job (130 / 143). After max_restarts restarts
// the next failure ends the job: "fabric: giving up after 3 restarts (fabric.max_restarts): ..."
// with the failed rank's status (128 + signal for a signal).
#ifndef FABRIC_DISTRIBUTED_RESTART_AGENT_H_
#define FABRIC_DISTRIBUTED_RESTART_AGENT_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace fabric {

struct RestartAgentOptions {
  int64_t world_size = 1;
  int64_t max_restarts = 0;
  std::chrono::milliseconds backoff{1000};          // fabric.restart_backoff_s
  std::chrono::milliseconds store_timeout{300000};  // fabric.ddp.timeout_s
  std::chrono::milliseconds grace{5000};            // SIGTERM → SIGKILL
  std::vector<std::string> argv;                    // empty: this process's command line
};

// Supervises the job as above; returns the exit status for main. Throws fabric::Error when the
// store or the first processes cannot be started.
int run_restart_agent(const RestartAgentOptions& options);

}  // namespace fabric

#endif  // FABRIC_DISTRIBUTED_RESTART_AGENT_H_
