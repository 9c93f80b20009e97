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

#include "fabric/connector.h"
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

// A logger of the user's own receives what the built-in ones do, after them, survives a new run
// directory, and is flushed when the launched function returns.
class RecordingLogger : public fabric::MetricLogger {
 public:
  explicit RecordingLogger(std::vector<std::string>* record) : record_(record) {}
  void log(const std::map<std::string, double>& values, int64_t step) override {
    for (const auto& [name, value] : values)
      record_->push_back(std::to_string(step) + ":" + name + "=" + std::to_string(value));
  }
  void flush() override { record_->push_back("flush"); }

 private:
  std::vector<std::string>* record_;
};

TEST_F(MetricsCsvTest, AddedLoggerReceivesEveryLogAndIsFlushedAtTheEndOfLaunch) {
  std::vector<std::string> record;
  fabric::Fabric f(fabric::Config::defaults(
                       fabric::training_schema(),
                       {"logging.run_dir=" + (dir_ / "{name}").string(), "logging.loggers=[csv]"}),
                   fabric::MachineFacts{});
  f.add_logger(std::make_unique<RecordingLogger>(&record));
  EXPECT_THROW(f.add_logger(nullptr), fabric::Error);
  const int status = f.launch([&](fabric::Fabric& fab) {
    fab.create_run_directory("first");
    fab.log("loss", 0.5, 1);
    fab.create_run_directory("second");  // built-in loggers reopen; the added one stays
    fab.log_dict({{"acc", 0.25}, {"loss", 0.125}}, 2);
  });
  EXPECT_EQ(status, 0);
  EXPECT_EQ(record, (std::vector<std::string>{"1:loss=0.500000", "2:acc=0.250000",
                                              "2:loss=0.125000", "flush"}));
  EXPECT_EQ(read(dir_ / "first" / "metrics.csv"), "step,loss\n1,0.5\n");
  EXPECT_EQ(read(dir_ / "second" / "metrics.csv"), "step,acc,loss\n2,0.25,0.125\n");
}

}  // namespace
