// metrics.csv: columns in first-logged order, merged rows per step, a wider header rewrites the
// file with empty cells for earlier rows, bad names and decreasing steps refused; and Fabric::log
// writing it in the run directory (global rank 0).
#include "fabric/logging/metrics_csv.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "fabric/core/error.h"
#include "fabric/fabric.h"

namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class MetricsCsvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "metrics_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(MetricsCsvTest, RowsPerStepAndAWiderHeaderRewritesTheFile) {
  const fs::path file = dir_ / "metrics.csv";
  {
    fabric::CsvMetrics m(file);
    EXPECT_EQ(read(file), "step\n");
    m.log({{"loss", 2.5}, {"lr", 0.1}}, 10);
    m.log({{"loss", 2.25}}, 10);  // same step: merged, later value wins
    m.log({{"loss", 2.0}, {"lr", 0.05}}, 20);
    EXPECT_EQ(read(file), "step,loss,lr\n10,2.25,0.1\n");  // step 20 pending
    m.log({{"acc", 0.5}}, 20);
    m.log({{"loss", 1.5}}, 30);
    EXPECT_EQ(read(file), "step,loss,lr,acc\n10,2.25,0.1,\n20,2,0.05,0.5\n");
    EXPECT_THROW(m.log({{"loss", 1.0}}, 29), fabric::Error);
    EXPECT_THROW(m.log({{"a,b", 1.0}}, 30), fabric::Error);
    EXPECT_THROW(m.log({{"", 1.0}}, 30), fabric::Error);
  }  // the destructor writes step 30
  EXPECT_EQ(read(file), "step,loss,lr,acc\n10,2.25,0.1,\n20,2,0.05,0.5\n30,1.5,,\n");
}

TEST_F(MetricsCsvTest, FabricLogWritesMetricsCsvInTheRunDirectory) {
  auto config = fabric::Config::defaults(fabric::training_schema(),
                                         {"logging.run_dir=" + (dir_ / "run").string()});
  auto f = std::make_unique<fabric::Fabric>(config, fabric::MachineFacts{});
  EXPECT_THROW(f->log("loss", 1.0, 0), fabric::Error);  // no run directory yet
  const auto run = f->create_run_directory("test");
  f->log("loss", 1.5, 1);
  f->log("loss", torch::tensor(1.25), 2);
  f->log_dict({{"loss", 1.0}, {"acc", 0.75}}, 3);
  f->log("acc", 0.875, 4);
  fabric::Fabric quiet(fabric::Config::defaults(
                           fabric::training_schema(),
                           {"logging.run_dir=" + (dir_ / "quiet").string(), "logging.loggers=[]"}),
                       fabric::MachineFacts{});
  quiet.create_run_directory("test");
  quiet.log("loss", 1.0, 1);
  EXPECT_FALSE(fs::exists(dir_ / "quiet" / "metrics.csv"));
  f.reset();  // flushes the pending row
  EXPECT_EQ(read(run.path() / "metrics.csv"),
            "step,loss,acc\n1,1.5,\n2,1.25,\n3,1,0.75\n4,,0.875\n");
}

}  // namespace
