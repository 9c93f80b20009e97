#include "fabric/distributed/heartbeat.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"

namespace fabric::distributed {
namespace {

using Clock = std::chrono::steady_clock;

const std::string kFailed = "fabric/heartbeat/failed";
const std::string kFailure = "fabric/heartbeat/failure";
const std::string kStopped = "fabric/heartbeat/stopped";

std::string beat_key(int64_t rank) { return "fabric/heartbeat/" + std::to_string(rank); }

std::string seconds(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

struct Heartbeat::State {
  HeartbeatOptions options;
  std::function<void(const std::string&)> on_failure;
  c10::intrusive_ptr<c10d::Store> store;
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  bool beat_done = false;
  std::atomic<bool> failed{false};
  std::atomic<int64_t> last_answer_ns{0};  // steady clock: the store's last answer

  void fail(const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (stopping) return;
    }
    if (!failed.exchange(true)) on_failure(message);
  }
  bool sleep() {  // false when stopping
    std::unique_lock<std::mutex> lock(mutex);
    return !wake.wait_for(lock, options.interval, [this] { return stopping; });
  }
  void answered() { last_answer_ns = Clock::now().time_since_epoch().count(); }
};

Heartbeat::Heartbeat(const HeartbeatOptions& options,
                     std::function<void(const std::string&)> on_failure)
    : state_(std::make_shared<State>()) {
  state_->options = options;
  state_->on_failure = std::move(on_failure);
  StoreOptions client;
  client.host = options.host;
  client.port = options.port;
  client.world_size = options.world_size;
  client.timeout = options.timeout;
  client.prefix = options.prefix;
  state_->store = make_store(client);
  state_->answered();
  beat_thread_ = std::thread(beat, state_);
  watch_thread_ = std::thread(watch, state_);
}

Heartbeat::~Heartbeat() { stop(); }

void Heartbeat::stop() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  if (watch_thread_.joinable()) watch_thread_.join();
  if (!beat_thread_.joinable()) return;
  // The beat thread may be blocked on a store that no longer answers: wait a bounded time, then
  // let it go (it only holds the shared state).
  std::unique_lock<std::mutex> lock(state_->mutex);
  const bool done =
      state_->wake.wait_for(lock, state_->options.timeout, [this] { return state_->beat_done; });
  lock.unlock();
  if (done) {
    beat_thread_.join();
  } else {
    beat_thread_.detach();
  }
}

void Heartbeat::finish() {
  auto& store = state_->store;
  const auto& o = state_->options;
  try {
    store->add(kStopped, 1);
    if (o.rank != 0) return;
    const auto deadline = Clock::now() + o.timeout;
    while (store->add(kStopped, 0) < o.world_size && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } catch (const std::exception&) {
    // Best effort: the job is ending anyway.
  }
}

void Heartbeat::report_failure(const std::string& what) {
  stop();
  try {
    auto& store = state_->store;
    if (store->add(kFailed, 0) == 0) {
      store->set(kFailure, std::vector<uint8_t>(what.begin(), what.end()));
      store->add(kFailed, 1);
    }
  } catch (const std::exception&) {
    // Best effort: the others notice the missing heartbeat instead.
  }
}

void Heartbeat::watch(const std::shared_ptr<State>& state) {
  const auto& o = state->options;
  while (state->sleep()) {
    const auto silent =
        Clock::now() - Clock::time_point(Clock::duration(state->last_answer_ns.load()));
    if (silent < o.timeout + o.interval) continue;
    state->fail(o.rank == 0 ? "the rendezvous store has not answered for " + seconds(silent)
                            : "rank 0 (host of the rendezvous store) has not answered for " +
                                  seconds(silent) + " (killed, crashed or frozen)");
    return;
  }
}

void Heartbeat::beat(const std::shared_ptr<State>& state) {
  const auto& o = state->options;
  auto& store = state->store;
  std::vector<int64_t> seen(static_cast<size_t>(o.world_size), -1);
  std::vector<Clock::time_point> moved(static_cast<size_t>(o.world_size), Clock::now());
  auto done = [&] {
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      state->beat_done = true;
    }
    state->wake.notify_all();
  };
  do {
    try {
      store->add(beat_key(o.rank), 1);
      if (store->add(kFailed, 0) > 0) {
        const auto bytes = store->get(kFailure);
        state->fail(std::string(bytes.begin(), bytes.end()));
        return done();
      }
      state->answered();
      if (o.rank != 0) continue;
      const auto now = Clock::now();
      for (int64_t r = 1; r < o.world_size; ++r) {
        const int64_t count = store->add(beat_key(r), 0);
        const auto i = static_cast<size_t>(r);
        if (count != seen[i]) {
          seen[i] = count;
          moved[i] = now;
        } else if (now - moved[i] >= o.timeout) {
          const std::string message =
              "rank " + std::to_string(r) +
              (count <= 0 ? " never sent a heartbeat" : " stopped sending heartbeats") + " " +
              seconds(now - moved[i]) + " ago (killed, crashed or frozen)";
          try {
            store->set(kFailure, std::vector<uint8_t>(message.begin(), message.end()));
            store->add(kFailed, 1);
          } catch (const std::exception&) {
          }
          state->fail(message);
          return done();
        }
      }
    } catch (const std::exception& e) {
      state->fail(o.rank == 0
                      ? "the rendezvous store stopped answering: " + first_line(e.what())
                      : "rank 0 (host of the rendezvous store) is gone: " + first_line(e.what()));
      return done();
    }
  } while (state->sleep());
  done();
}

}  // namespace fabric::distributed
