#include "fabric/logging/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace fabric {
namespace {

constexpr size_t kDurationWindow = 32;
constexpr double kRedrawSeconds = 0.1;
constexpr int kBarCells = 20;

int terminal_width() {
  winsize w{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  return 100;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(std::ostream& out, Options options)
    : out_(out), options_(std::move(options)) {
  if (!options_.now()) {
    options_.now([] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
    });
  }
  if (options_.in_place() && options_.width() <= 0) options_.width(terminal_width());
  step_ = options_.start_step();
  last_time_ = options_.now()();
}

ProgressBar::~ProgressBar() { finish(); }

bool ProgressBar::in_place_for(const std::string& setting) {
  if (setting == "true") return true;
  if (setting == "false") return false;
  const char* term = std::getenv("TERM");
  return isatty(STDOUT_FILENO) == 1 && !(term != nullptr && std::strcmp(term, "dumb") == 0);
}

std::string ProgressBar::format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<long long>(std::llround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", s / 60, s % 60);
  }
  return buf;
}

double ProgressBar::eta_seconds() const {
  if (durations_.empty()) return -1;
  std::vector<double> d(durations_.begin(), durations_.end());
  std::nth_element(d.begin(), d.begin() + static_cast<long>(d.size() / 2), d.end());
  const double median = d[d.size() / 2];
  return median * static_cast<double>(std::max<int64_t>(0, options_.total_steps() - step_));
}

std::string ProgressBar::render(bool in_place, int width) const {
  std::string line = "epoch " + std::to_string(std::min(epoch_ + 1, options_.max_epochs())) + "/" +
                     std::to_string(options_.max_epochs());
  const int64_t total = std::max<int64_t>(options_.total_steps(), 1);
  if (in_place) {
    const double frac =
        std::clamp(static_cast<double>(step_) / static_cast<double>(total), 0.0, 1.0);
    const int full = static_cast<int>(frac * kBarCells);
    line += " [" + std::string(static_cast<size_t>(full), '#') +
            std::string(static_cast<size_t>(kBarCells - full), '.') + "] " +
            fmt("%.0f%%", std::floor(frac * 100)) + " " + std::to_string(step_) + "/" +
            std::to_string(options_.total_steps());
  } else {
    line += " step " + std::to_string(step_) + "/" + std::to_string(options_.total_steps());
  }
  if (loss_ >= 0 || std::isnan(loss_)) line += " loss " + fmt("%.4f", loss_);
  if (lr_ >= 0) line += " lr " + fmt("%.5f", lr_);
  if (images_per_second_ >= 0) line += " " + fmt("%.0f", images_per_second_) + " " + rate_unit_;
  if (mfu_ >= 0) line += " MFU " + fmt("%.1f%%", 100 * mfu_);
  const double eta = eta_seconds();
  if (eta >= 0) line += " ETA " + format_duration(eta);
  if (in_place && width > 1 && static_cast<int>(line.size()) > width - 1)
    line.resize(static_cast<size_t>(width - 1));
  return line;
}

void ProgressBar::set_metrics(double loss, double lr, double images_per_second) {
  loss_ = loss;
  lr_ = lr;
  images_per_second_ = images_per_second;
  last_draw_ = -1;  // show new values at the next step
}

void ProgressBar::set_throughput(double per_second, const std::string& unit, double mfu) {
  images_per_second_ = per_second;
  rate_unit_ = unit;
  mfu_ = mfu;
  last_draw_ = -1;
}

void ProgressBar::step(int64_t step, int64_t epoch) {
  const double now = options_.now()();
  const int64_t advanced = step - step_;
  if (advanced > 0) {
    durations_.push_back((now - last_time_) / static_cast<double>(advanced));
    if (durations_.size() > kDurationWindow) durations_.pop_front();
  }
  last_time_ = now;
  step_ = step;
  epoch_ = epoch;
  if (options_.in_place()) {
    if (last_draw_ < 0 || now - last_draw_ >= kRedrawSeconds || step >= options_.total_steps()) {
      last_draw_ = now;
      draw();
    }
  } else if (step % std::max<int64_t>(options_.log_every(), 1) == 0 ||
             step == options_.total_steps()) {
    out_ << render(false, 0) << std::endl;
  }
}

void ProgressBar::draw() {
  out_ << "\r" << render(true, options_.width()) << "\x1b[K" << std::flush;
  drawn_ = true;
}

void ProgressBar::print_line(const std::string& line) {
  if (drawn_) out_ << "\r\x1b[K";
  out_ << line << "\n";
  if (drawn_) {
    draw();
  } else {
    out_.flush();
  }
}

void ProgressBar::finish() {
  if (!drawn_) return;
  out_ << "\n" << std::flush;
  drawn_ = false;
}

}  // namespace fabric
