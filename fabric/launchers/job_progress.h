// What the ranks of a restartable job tell their supervisor, and what a restarted rank learns
// about the attempt it belongs to.
//
//   - JobProgress: a page of shared memory (memfd) the restart agent (restart_agent.h) creates and
//     its children inherit (FABRIC_PROGRESS_FD): each rank's last completed step, written by
//     publish_step() (one relaxed store; nothing when the process was not started by the agent).
//     After a failure the agent reads the furthest step any rank reached.
//   - restart_attempt(): which attempt this process is: FABRIC_RESTART_COUNT (the restart agent)
//     or TORCHELASTIC_RESTART_COUNT (torchrun --max-restarts); 0 for a first start.
//   - job_start_time(): when the job began: FABRIC_JOB_START_NS (set by the restart agent), else
//     the start time of this process's parent (torchrun's agent, alive for the whole job; known to
//     the second): every checkpoint written by any attempt of this job is newer.
#ifndef FABRIC_LAUNCHERS_JOB_PROGRESS_H_
#define FABRIC_LAUNCHERS_JOB_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <optional>

#include "fabric/core/cluster_environment.h"

namespace fabric {

class JobProgress {
 public:
  // A page for `world_size` ranks, every step -1. Throws fabric::Error if it cannot be made.
  explicit JobProgress(int64_t world_size);
  ~JobProgress();
  JobProgress(const JobProgress&) = delete;
  JobProgress& operator=(const JobProgress&) = delete;

  // The descriptor children inherit (not close-on-exec).
  int fd() const { return fd_; }
  // The furthest step any rank published (-1: none yet); reset() sets every rank back to -1.
  int64_t furthest_step() const;
  void reset();

 private:
  int fd_ = -1;
  int64_t slots_ = 0;
  int64_t* steps_ = nullptr;
};

// In a rank the restart agent started: records that this rank completed `step`. Cheap (a store to
// shared memory); does nothing in other processes. Thread-safe.
void publish_step(int64_t step);

// This process's attempt: FABRIC_RESTART_COUNT, else TORCHELASTIC_RESTART_COUNT, else 0.
int64_t restart_attempt(const EnvGetter& env);
// The furthest step the previous attempt reached (FABRIC_FAILED_STEP, set by the restart agent);
// nullopt when unknown.
std::optional<int64_t> failed_attempt_step(const EnvGetter& env);
// When the job began (see above); nullopt when neither the variable nor /proc can say.
std::optional<std::chrono::system_clock::time_point> job_start_time(const EnvGetter& env);

}  // namespace fabric

#endif  // FABRIC_LAUNCHERS_JOB_PROGRESS_H_
