#include "fabric/training/profiler.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <system_error>

#include "fabric/core/error.h"

namespace fabric {
namespace {

namespace kineto = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

std::set<impl::ActivityType> activities(const StepProfilerOptions& o) {
  std::set<impl::ActivityType> out;
  if (o.cpu) out.insert(impl::ActivityType::CPU);
  if (o.cuda) out.insert(impl::ActivityType::CUDA);
  return out;
}

impl::ProfilerConfig config_of(const StepProfilerOptions& o) {
  return impl::ProfilerConfig(impl::ProfilerState::KINETO, o.record_shapes, o.profile_memory,
                              o.with_stack);
}

// Runs `start` (prepareProfiler or enableProfiler), its failure one fabric::Error.
template <typename Start>
void starting(Start&& start) {
  try {
    start();
  } catch (const std::exception& e) {
    std::string why = e.what();
    throw Error("profiler: cannot start LibTorch's profiler (" + why.substr(0, why.find('\n')) +
                ")");
  }
}

}  // namespace

StepProfiler::StepProfiler(StepProfilerOptions options) : options_(std::move(options)) {
  if (options_.wait < 0 || options_.warmup < 0 || options_.repeat < 0)
    throw Error("profiler: wait, warmup and repeat must be >= 0");
  if (options_.active < 1) throw Error("profiler: active must be >= 1");
  if (!options_.cpu && !options_.cuda) throw Error("profiler: no activity to record (cpu, cuda)");
  // Recording CPU ops only, Kineto still looks for GPUs; with a CUDA build of LibTorch on a
  // machine without them it logs "ERROR ... gpuGetDeviceCount failed with code 35" (no driver),
  // which reads like a failure and is none. Its log level, read when it starts, silences that
  // unless the user set one (KINETO_LOG_LEVEL=2 shows its warnings again).
  if (!options_.cuda) setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
}

StepProfiler::~StepProfiler() {
  if (recording_) {
    try {
      kineto::disableProfiler();
    } catch (...) {
    }
  }
}

void StepProfiler::start_recording() {
  starting([&] {
    if (!prepared_) kineto::prepareProfiler(config_of(options_), activities(options_));
    kineto::enableProfiler(config_of(options_), activities(options_));
  });
  prepared_ = false;
  recording_ = true;
}

void StepProfiler::stop_recording(bool write) {
  recording_ = false;
  const auto result = kineto::disableProfiler();
  if (!write || !result) return;
  std::error_code ec;
  std::filesystem::create_directories(options_.dir, ec);
  const auto path = options_.dir / ("rank_" + std::to_string(options_.rank) + "_step_" +
                                    std::to_string(step_) + ".pt.trace.json");
  try {
    result->save(path.string());
  } catch (const std::exception& e) {
    std::string why = e.what();
    throw Error("profiler: cannot write " + path.string() + " (" + why.substr(0, why.find('\n')) +
                ")");
  }
  traces_.push_back(path);

  // Self time: per thread, an op's duration less that of the ops it encloses.
  struct Span {
    uint64_t start, end;
    std::string name;
    double children = 0;
  };
  std::map<uint64_t, std::vector<Span>> by_thread;
  for (const auto& e : result->events()) {
    if (e.deviceType() == c10::DeviceType::CPU) {
      by_thread[e.startThreadId()].push_back({e.startNs(), e.endNs(), e.name()});
    } else {
      auto& t = device_[e.name()];
      ++t.calls;
      t.self_ns += static_cast<double>(e.durationNs());
      t.total_ns += static_cast<double>(e.durationNs());
    }
  }
  for (auto& [thread, spans] : by_thread) {
    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.start != b.start ? a.start < b.start : a.end > b.end;
    });
    std::vector<Span*> open;
    const auto close = [&](Span* s) {
      auto& t = cpu_[s->name];
      const double total = static_cast<double>(s->end - s->start);
      ++t.calls;
      t.total_ns += total;
      t.self_ns += std::max(0.0, total - s->children);
    };
    for (auto& s : spans) {
      while (!open.empty() && open.back()->end <= s.start) {
        close(open.back());
        open.pop_back();
      }
      if (!open.empty()) open.back()->children += static_cast<double>(s.end - s.start);
      open.push_back(&s);
    }
    while (!open.empty()) {
      close(open.back());
      open.pop_back();
    }
  }
}

void StepProfiler::step() {
  ++step_;
  if (options_.repeat > 0 && cycles_done_ >= options_.repeat) return;
  const int64_t cycle = options_.wait + options_.warmup + options_.active;
  const int64_t at = step_ % cycle;  // the position of the next step in its cycle
  if (recording_ && at == 0) {       // the last active step just ended
    stop_recording(/*write=*/true);
    ++cycles_done_;
    if (options_.repeat > 0 && cycles_done_ >= options_.repeat) return;
  }
  if (at == options_.wait && options_.warmup > 0 && !prepared_ && !recording_) {
    starting([&] { kineto::prepareProfiler(config_of(options_), activities(options_)); });
    prepared_ = true;
  }
  if (at == options_.wait + options_.warmup && !recording_) start_recording();
}

std::string StepProfiler::table() const {
  if (cpu_.empty() && device_.empty()) return "";
  std::string out;
  char line[512];
  const auto rows = [&](const std::map<std::string, OpTime>& ops, const char* what) {
    std::vector<std::pair<std::string, OpTime>> sorted(ops.begin(), ops.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& a, const auto& b) { return a.second.self_ns > b.second.self_ns; });
    double all = 0;
    for (const auto& [name, t] : sorted) all += t.self_ns;
    std::snprintf(line, sizeof line, "%-48s %8s %12s %7s %12s\n", what, "calls", "self ms",
                  "self %", "total ms");
    out += line;
    const size_t n = std::min<size_t>(sorted.size(), static_cast<size_t>(options_.row_limit));
    for (size_t i = 0; i < n; ++i) {
      const auto& [name, t] = sorted[i];
      std::snprintf(line, sizeof line, "%-48.48s %8lld %12.3f %6.1f%% %12.3f\n", name.c_str(),
                    static_cast<long long>(t.calls), t.self_ns / 1e6,
                    all > 0 ? 100.0 * t.self_ns / all : 0.0, t.total_ns / 1e6);
      out += line;
    }
  };
  if (!cpu_.empty()) rows(cpu_, "CPU ops (self time)");
  if (!device_.empty()) rows(device_, "device kernels");
  return out;
}

}  // namespace fabric
