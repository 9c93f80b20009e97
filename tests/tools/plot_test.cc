// //tools:plot draws metrics.csv curves (one run, or every run of a sweep) to a PNG of the asked
// size; bad input is one line and exit status 2.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>

#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

// Width and height from the PNG signature + IHDR chunk; {0, 0} when `path` is not a PNG.
std::pair<uint32_t, uint32_t> png_size(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char h[24] = {};
  in.read(reinterpret_cast<char*>(h), sizeof(h));
  const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (!in || !std::equal(sig, sig + 8, h) || std::string(h + 12, h + 16) != "IHDR") return {0, 0};
  auto be = [&](int o) {
    return uint32_t(h[o]) << 24 | uint32_t(h[o + 1]) << 16 | uint32_t(h[o + 2]) << 8 | h[o + 3];
  };
  return {be(16), be(20)};
}

class PlotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "plot_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_metrics(const fs::path& run, double scale) {
    fs::create_directories(run);
    std::ofstream(run / "metrics.csv")
        << "step,epoch,lr,train/loss,test/accuracy\n"
        << "10,1," << 0.1 * scale << ",2.0,\n20,1," << 0.05 * scale << ",1.5,0.6\n"
        << "30,2," << 0.01 * scale << ",1.0,0.8\n";
  }
  fabric::testing::CommandResult plot(const std::string& args) {
    return fabric::testing::run_command("BUILD_WORKING_DIRECTORY='" + dir_.string() + "' '" +
                                        (fs::current_path() / "tools" / "plot").string() + "' " +
                                        args);
  }
  fs::path dir_;
};

TEST_F(PlotTest, OneRunGivesAPngOfTheAskedSize) {
  write_metrics(dir_ / "run", 1);
  const auto r = plot("run --size=640x480");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(png_size(dir_ / "run" / "metrics.png"), std::make_pair(640u, 480u)) << r.out;
  EXPECT_NE(r.out.find("run/metrics.png"), std::string::npos) << r.out;
}

TEST_F(PlotTest, ASweepGivesOneCurvePerRun) {
  write_metrics(dir_ / "sweep" / "runs" / "lr=0.1", 1);
  write_metrics(dir_ / "sweep" / "runs" / "lr=0.2", 2);
  const auto r = plot("sweep --out=all.png --metrics=train/loss,lr");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(png_size(dir_ / "all.png"), std::make_pair(1200u, 800u)) << r.out;
}

// A sweep directory with its state and results: curves coloured by status (counted in the printed
// line) and metric_by_key.png, the metric against each swept key for the runs that have it.
TEST_F(PlotTest, ASweepWithStateColoursByStatusAndPlotsTheMetricByKey) {
  const fs::path sweep = dir_ / "sweep";
  write_metrics(sweep / "runs" / "lr=0.1_width=8", 1);
  write_metrics(sweep / "runs" / "lr=2_width=16", 2);
  write_metrics(sweep / "runs" / "lr=2_width=16-1", 2);  // its resumed attempt
  std::ofstream(sweep / "sweep_state.json")
      << R"({"version": 1, "runs": {"lr=0.1_width=8": {"status": "done"},)"
      << R"( "lr=2_width=16": {"status": "pruned"}}})";
  std::ofstream(sweep / "results.csv")
      << "run,status,exit_code,attempts,optimizer.lr,model.width,seed,test_accuracy,steps,"
         "wall_time_s,run_dir,reason\n"
      << "lr=0.1_width=8,done,0,1,0.1,8,,0.8,30,1.5,x,\n"
      << "lr=2_width=16,pruned,143,1,2,16,,,,0.5,x,\"pruned: test/accuracy 0.6 at step 20\"\n";
  const auto r = plot("sweep --size=800x600");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("sweep/curves.png: 3 curves (1 done, 2 pruned)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("sweep/metric_by_key.png: test_accuracy against optimizer.lr, model.width "
                       "(1 run)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(png_size(sweep / "curves.png"), std::make_pair(800u, 600u)) << r.out;
  EXPECT_EQ(png_size(sweep / "metric_by_key.png"), std::make_pair(800u, 600u)) << r.out;
}

TEST_F(PlotTest, BadInputIsOneLineAndExitTwo) {
  auto r = plot("nowhere");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out,
            "plot: nowhere: no metrics.csv (give a run directory, a metrics.csv or a sweep "
            "directory)\n");
  write_metrics(dir_ / "run", 1);
  r = plot("run --size=12x5");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--size=12x5: expected WIDTHxHEIGHT"), std::string::npos) << r.out;
  r = plot("run --metrics=test/acc");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("no column test/acc in the data (columns: train/loss, test/accuracy, lr)"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "run" / "metrics.png"));
}

}  // namespace
