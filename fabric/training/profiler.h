// fabric::StepProfiler: LibTorch's profiler (Kineto) on a schedule of training steps, as
// torch.profiler.schedule(wait, warmup, active, repeat) runs it: each cycle skips `wait` steps,
// warms the profiler up for `warmup` steps, records `active` steps and writes them as one
// Chrome/Perfetto trace (ui.perfetto.dev, chrome://tracing and TensorBoard's profile plugin open
// it); `repeat` cycles (0: until the run ends). Through the C++ API alone (no Python).
//
//   fabric::StepProfiler profiler(options);  // options.dir, .rank: where the traces go
//   for (...) { train_step(); profiler.step(); }
//   std::cout << profiler.table();            // the ops by self CPU time over every active step
//
// Traces: DIR/rank_<R>_step_<S>.pt.trace.json, S the last step recorded. With cuda the device's
// kernels are recorded too (CUPTI); shapes, memory and stacks on request (more overhead).
#ifndef FABRIC_TRAINING_PROFILER_H_
#define FABRIC_TRAINING_PROFILER_H_

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace fabric {

struct StepProfilerOptions {
  int64_t wait = 1, warmup = 1, active = 3, repeat = 1;  // repeat 0: every cycle to the end
  bool cpu = true, cuda = false;
  bool record_shapes = false, profile_memory = false, with_stack = false;
  std::filesystem::path dir;  // created when the first trace is written
  int64_t rank = 0;
  int64_t row_limit = 15;  // rows of table()
};

class StepProfiler {
 public:
  // Throws fabric::Error for a negative wait/warmup/repeat, active < 1 or no activity.
  explicit StepProfiler(StepProfilerOptions options);
  ~StepProfiler();  // stops a recording in progress without writing it
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // After each training step: moves the schedule on, starting or stopping the profiler. Throws
  // fabric::Error when the profiler cannot start (another one is running in this process) or the
  // trace cannot be written.
  void step();
  // Steps seen so far.
  int64_t steps() const { return step_; }
  // The traces written, in order.
  const std::vector<std::filesystem::path>& traces() const { return traces_; }
  // Ops by self CPU time over every recorded step: name, calls, self ms, self %, total ms (and
  // the CUDA kernels' time when recorded); "" before any recording ended.
  std::string table() const;

 private:
  struct OpTime {
    int64_t calls = 0;
    double self_ns = 0, total_ns = 0;
  };
  void start_recording();
  void stop_recording(bool write);

  StepProfilerOptions options_;
  int64_t step_ = 0;
  int64_t cycles_done_ = 0;
  bool prepared_ = false, recording_ = false;
  std::vector<std::filesystem::path> traces_;
  std::map<std::string, OpTime> cpu_, device_;
};

}  // namespace fabric

#endif  // FABRIC_TRAINING_PROFILER_H_
