#include "fabric/stop_signal.h"

#include <atomic>

#include "fabric/core/error.h"

namespace fabric {
namespace {

volatile sig_atomic_t g_got_signal = 0;
std::atomic<bool> g_installed{false};

void on_stop_signal(int) { g_got_signal = 1; }

}  // namespace

StopSignal::StopSignal(Fabric& f, int64_t every) : f_(f), every_(every) {
  if (every_ < 1) throw Error("StopSignal: every must be at least 1, not " + std::to_string(every));
  if (g_installed.exchange(true)) throw Error("StopSignal: only one may exist at a time");
  g_got_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, &previous_);
}

StopSignal::~StopSignal() {
  sigaction(SIGTERM, &previous_, nullptr);
  g_installed = false;
}

bool StopSignal::requested(int64_t step) {
  if (f_.world_size() == 1) return g_got_signal != 0;
  if (step % every_ != 0) return false;
  return f_.all_reduce(g_got_signal != 0 ? 1.0 : 0.0, ReduceOp::kMax) > 0;
}

}  // namespace fabric
