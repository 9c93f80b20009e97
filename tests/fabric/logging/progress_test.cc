// The progress bar: plain lines at the logging period, in-place redraws (throttled, cut to the
// width, lines printed above it), and an ETA that an evaluation pause does not distort.
#include "fabric/logging/progress.h"

#include <gtest/gtest.h>

#include <sstream>

namespace fabric {
namespace {

struct FakeClock {
  double t = 0;
  std::function<double()> fn() {
    return [this] { return t; };
  }
};

ProgressBar::Options options(FakeClock& clock, bool in_place) {
  ProgressBar::Options o;
  o.total_steps(5);
  o.max_epochs(2);
  o.log_every(2);
  o.in_place(in_place);
  o.width(200);
  o.now(clock.fn());
  return o;
}

TEST(ProgressBar, PlainLinesEveryLogPeriodAndAtTheEnd) {
  FakeClock clock;
  std::ostringstream out;
  {
    ProgressBar bar(out, options(clock, false));
    for (int64_t step = 1; step <= 5; ++step) {
      clock.t += 1;
      if (step == 2) bar.set_metrics(0.5, 0.1, 100);
      bar.step(step, step <= 3 ? 0 : 1);
    }
  }
  EXPECT_EQ(out.str(),
            "epoch 1/2 step 2/5 loss 0.5000 lr 0.10000 100 img/s ETA 0:03\n"
            "epoch 2/2 step 4/5 loss 0.5000 lr 0.10000 100 img/s ETA 0:01\n"
            "epoch 2/2 step 5/5 loss 0.5000 lr 0.10000 100 img/s ETA 0:00\n");
}

TEST(ProgressBar, InPlaceRedrawsAreThrottledAndLinesGoAbove) {
  FakeClock clock;
  std::ostringstream out;
  ProgressBar bar(out, options(clock, true));
  bar.step(1, 0);  // first draw
  bar.step(2, 0);  // same instant: not redrawn
  EXPECT_EQ(out.str(), "\repoch 1/2 [####................] 20% 1/5 ETA 0:00\x1b[K");
  out.str("");
  bar.print_line("epoch 1 test accuracy 0.5");
  EXPECT_EQ(out.str(), "\r\x1b[Kepoch 1 test accuracy 0.5\n\r" + bar.render(true, 200) + "\x1b[K");
  out.str("");
  clock.t += 1;
  bar.step(5, 1);  // the last step is always drawn
  EXPECT_NE(out.str().find("[####################] 100% 5/5"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find('\n'), std::string::npos);
  bar.finish();
  EXPECT_EQ(out.str().back(), '\n');
  out.str("");
  bar.finish();  // idempotent
  EXPECT_EQ(out.str(), "");
}

TEST(ProgressBar, InPlaceLineIsCutToTheWidth) {
  FakeClock clock;
  std::ostringstream out;
  auto o = options(clock, true);
  o.width(30);
  ProgressBar bar(out, o);
  bar.set_metrics(1.25, 0.01, 12345);
  EXPECT_EQ(bar.render(true, 30), "epoch 1/2 [..................");
  EXPECT_EQ(bar.render(false, 30), "epoch 1/2 step 0/5 loss 1.2500 lr 0.01000 12345 img/s");
}

TEST(ProgressBar, EtaIsTheMedianStepTimeTimesTheStepsLeft) {
  FakeClock clock;
  std::ostringstream out;
  auto o = options(clock, false);
  o.total_steps(100);
  o.log_every(1000);
  ProgressBar bar(out, o);
  for (int64_t step = 1; step <= 10; ++step) {
    clock.t += step == 5 ? 120 : 0.5;  // an evaluation pause at step 5
    bar.step(step, 0);
  }
  EXPECT_NE(bar.render(false, 0).find("ETA 0:45"), std::string::npos) << bar.render(false, 0);
}

TEST(ProgressBar, ResumedRunsStartAtTheirStep) {
  FakeClock clock;
  std::ostringstream out;
  auto o = options(clock, false);
  o.start_step(3);
  ProgressBar bar(out, o);
  clock.t += 2;
  bar.step(4, 1);
  EXPECT_EQ(out.str(), "epoch 2/2 step 4/5 ETA 0:02\n");
}

TEST(ProgressBar, Durations) {
  EXPECT_EQ(ProgressBar::format_duration(41.4), "0:41");
  EXPECT_EQ(ProgressBar::format_duration(725), "12:05");
  EXPECT_EQ(ProgressBar::format_duration(3723), "1:02:03");
  EXPECT_EQ(ProgressBar::format_duration(-1), "?");
  EXPECT_FALSE(ProgressBar::in_place_for("false"));
  EXPECT_TRUE(ProgressBar::in_place_for("true"));
}

}  // namespace
}  // namespace fabric
