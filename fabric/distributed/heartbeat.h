// fabric::distributed::Heartbeat: surviving ranks learn within seconds that a rank of the job is
// gone, also when an external launcher (torchrun, srun, mpirun) would leave them blocked in a
// collective until its timeout.
//
// Every rank runs a thread with its own connection to the rendezvous store (timeout = the
// heartbeat timeout, so a vanished store host is noticed in time too):
//   - it beats: adds 1 to fabric/heartbeat/<rank> every interval;
//   - rank 0 watches every rank's counter: one that has not moved for `timeout` is dead;
//   - every rank watches fabric/heartbeat/failure (set when rank 0 declares a rank dead, or when a
//     rank reports its own error, report_failure());
//   - a store that cannot be reached, or does not answer for `timeout` (a frozen host: store
//     requests have no timeout of their own, so a second thread watches the first), means rank 0
//     (its host) is gone.
// The first failure calls `on_failure(message)` once, from the thread, e.g.
//   "rank 1 stopped sending heartbeats 5.0 s ago (killed, crashed or frozen)". Ddp ends the
// process there: its main thread may be blocked in a collective that will never complete.
//
// Orderly end: every rank calls stop() after the job's last barrier; rank 0 then waits (finish())
// until every rank has stopped beating before the store goes away, so a rank that merely finished
// is never taken for dead.
#ifndef FABRIC_DISTRIBUTED_HEARTBEAT_H_
#define FABRIC_DISTRIBUTED_HEARTBEAT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace fabric::distributed {

struct HeartbeatOptions {
  std::string host = "127.0.0.1";  // the rendezvous store
  int port = 0;
  std::string prefix;  // the job's store key prefix (StoreOptions::prefix)
  int64_t rank = 0;
  int64_t world_size = 1;
  std::chrono::milliseconds interval{1000};
  std::chrono::milliseconds timeout{5000};  // no beat for this long: dead
};

class Heartbeat {
 public:
  // Connects and starts the thread. Throws fabric::Error when the store cannot be reached.
  Heartbeat(const HeartbeatOptions& options, std::function<void(const std::string&)> on_failure);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // Stops beating and watching; joins the threads (a beat thread stuck on a store that no longer
  // answers is let go after the timeout). No callback after it returns. Idempotent.
  void stop();
  // After stop(), at the end of a job: announces this rank stopped; on rank 0 waits (at most the
  // timeout) until every rank has. Best effort: never throws.
  void finish();
  // This rank is failing with `what`: tells the others (best effort, never throws), then stop().
  void report_failure(const std::string& what);

 private:
  struct State;  // shared with the threads, which may outlive a Heartbeat stuck on a dead store
  static void beat(const std::shared_ptr<State>& state);
  static void watch(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_;
  std::thread beat_thread_, watch_thread_;
};

}  // namespace fabric::distributed

#endif  // FABRIC_DISTRIBUTED_HEARTBEAT_H_
