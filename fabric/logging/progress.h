// fabric::ProgressBar: training progress on global rank 0 (Fabric::progress_bar creates it).
//
// Two styles, chosen by `logging.progress_bar` (auto | true | false, default auto):
//   in place (true, or auto on a terminal): one line redrawn at most 10 times a second,
//     epoch 2/4 [########............] 41% 770/1876 loss 0.4123 lr 0.0831 5230 img/s ETA 0:41
//     cut to the terminal's width; Fabric::print lines appear above it, never mixed into it;
//   plain lines (false, or auto when stdout is not a terminal: logs, CI, sweeps): one line every
//     logging.log_every_n_steps steps and at the last step,
//     epoch 2/4 step 800/1876 loss 0.4123 lr 0.08310 5230 img/s ETA 0:41
// The loss is the mean over the last logging window (set_metrics, typically all-reduced across
// ranks every log_every_n_steps steps); the ETA is the remaining steps times the median of the
// last 32 step durations, so an evaluation pause does not distort it. step() never touches the
// GPU: calling it every step costs nothing measurable.
#ifndef FABRIC_LOGGING_PROGRESS_H_
#define FABRIC_LOGGING_PROGRESS_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <ostream>
#include <string>

#include "fabric/core/arg.h"

namespace fabric {

class ProgressBar {
 public:
  // Example: ProgressBar::Options().total_steps(1000).max_epochs(10).in_place(true).
  struct Options {
    FABRIC_ARG(int64_t, total_steps) = 0;  // Default: 0 (unknown).
    FABRIC_ARG(int64_t, max_epochs) = 0;
    FABRIC_ARG(int64_t, log_every) = 50;  // Default: a plain line every 50 steps.
    FABRIC_ARG(bool, in_place) = false;   // Default: plain lines (no \r redraws).
    FABRIC_ARG(int64_t, start_step) = 0;  // A resumed run starts here.
    FABRIC_ARG(int, width) = 0;           // In-place line width; 0: the terminal's (else 100).
    // Seconds; default: a steady clock (tests inject one).
    FABRIC_ARG(std::function<double()>, now) = nullptr;
  };

  ProgressBar(std::ostream& out, Options options);
  ~ProgressBar();  // finish()

  // The logging window's smoothed values (mean loss across ranks, learning rate, throughput).
  void set_metrics(double loss, double lr, double images_per_second);
  // The throughput in another unit than img/s (e.g. "tok/s"), and the model FLOPs utilization
  // (a fraction; shown as "MFU 31.2%" when >= 0).
  void set_throughput(double per_second, const std::string& unit, double mfu = -1);
  // After each optimizer step: `step` done so far (1-based), `epoch` 0-based.
  void step(int64_t step, int64_t epoch);
  // A line above the bar (the bar is cleared and redrawn).
  void print_line(const std::string& line);
  // Ends the in-place line with a newline (idempotent).
  void finish();

  // "0:41", "12:05", "1:02:03".
  static std::string format_duration(double seconds);
  // The current line of either style (without control characters).
  std::string render(bool in_place, int width) const;
  // logging.progress_bar → in place? ("auto": stdout is a terminal and TERM is not "dumb").
  static bool in_place_for(const std::string& setting);

 private:
  void draw();
  double eta_seconds() const;

  std::ostream& out_;
  Options options_;
  int64_t step_ = 0, epoch_ = 0;
  double loss_ = -1, lr_ = -1, images_per_second_ = -1, mfu_ = -1;
  std::string rate_unit_ = "img/s";
  double last_time_ = 0, last_draw_ = -1;
  std::deque<double> durations_;  // seconds per step, most recent last
  bool drawn_ = false;            // an unterminated in-place line is on screen
};

}  // namespace fabric

#endif  // FABRIC_LOGGING_PROGRESS_H_
