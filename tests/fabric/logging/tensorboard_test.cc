// TensorBoard event files: CRC-32C against the standard check value, and TensorBoard's own reader
// (the `tensorboard` Python package tools/setup.sh installs) finding the tags, steps and values
// Fabric::log wrote.
#include "fabric/logging/tensorboard.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "fabric/connector.h"
#include "fabric/fabric.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

TEST(TensorBoardTest, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(fabric::crc32c("123456789"), 0xE3069283u);  // CRC-32C catalogue check value
  EXPECT_EQ(fabric::crc32c(""), 0u);
}

TEST(TensorBoardTest, TensorBoardReadsTagsStepsAndValues) {
  std::string tmpl = (fs::path(::testing::TempDir()) / "tb_XXXXXX").string();
  const fs::path dir = mkdtemp(tmpl.data());
  {
    fabric::Fabric f(fabric::Config::defaults(fabric::training_schema(),
                                              {"logging.run_dir=" + (dir / "run").string(),
                                               "logging.loggers=[csv, tensorboard]"}),
                     fabric::MachineFacts{});
    f.create_run_directory("tb");
    f.log_dict({{"train/loss", 2.5}, {"lr", 0.1}}, 10);
    f.log("train/loss", 1.25, 20);
    f.log("test/accuracy", 0.75, 20);
    f.log("train/loss", -3.0e6, 123456789012LL);
  }
  const fs::path script = dir / "read.py";
  std::ofstream(script)
      << "import sys\n"
         "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
         "ea = EventAccumulator(sys.argv[1]); ea.Reload()\n"
         "for tag in sorted(ea.Tags()['scalars']):\n"
         "    print(tag, [(e.step, e.value) for e in ea.Scalars(tag)])\n";
  const auto r =
      fabric::testing::run_command(fabric::testing::python_interpreter() + " -W ignore " +
                                   script.string() + " " + (dir / "run").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("lr [(10, 0.10000000149011612)]\n"
                       "test/accuracy [(20, 0.75)]\n"
                       "train/loss [(10, 2.5), (20, 1.25), (123456789012, -3000000.0)]\n"),
            std::string::npos)
      << r.out;
  fs::remove_all(dir);
}

}  // namespace
