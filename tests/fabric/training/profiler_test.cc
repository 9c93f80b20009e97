// StepProfiler: the schedule records exactly the active steps of each cycle (user scopes named
// by step, read back from the Chrome traces), the traces are JSON with the ops in them, the
// top-ops table, and the errors.
#include "fabric/training/profiler.h"

#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "fabric/core/error.h"

namespace fs = std::filesystem;

namespace {

std::set<std::string> names_in(const fs::path& trace) {
  std::ifstream in(trace);
  const auto j = nlohmann::json::parse(in);
  std::set<std::string> names;
  for (const auto& e : j.at("traceEvents"))
    if (e.contains("name")) names.insert(e["name"].get<std::string>());
  return names;
}

TEST(StepProfilerTest, RecordsTheActiveStepsOfEachCycle) {
  fabric::StepProfilerOptions o;
  o.wait = 1;
  o.warmup = 1;
  o.active = 2;
  o.repeat = 2;
  o.dir = fs::path(::testing::TempDir()) / "profiler";
  fabric::StepProfiler profiler(o);
  auto model = torch::nn::Linear(16, 8);
  for (int step = 1; step <= 10; ++step) {
    {
      RECORD_USER_SCOPE(("train step " + std::to_string(step)).c_str());
      model->forward(torch::randn({4, 16})).sum().backward();
    }
    profiler.step();
  }
  ASSERT_EQ(profiler.traces().size(), 2u);
  EXPECT_EQ(profiler.traces()[0].filename(), "rank_0_step_4.pt.trace.json");
  EXPECT_EQ(profiler.traces()[1].filename(), "rank_0_step_8.pt.trace.json");
  const auto first = names_in(profiler.traces()[0]), second = names_in(profiler.traces()[1]);
  for (int step = 1; step <= 10; ++step) {
    const std::string scope = "train step " + std::to_string(step);
    EXPECT_EQ(first.count(scope), step == 3 || step == 4 ? 1u : 0u) << scope;
    EXPECT_EQ(second.count(scope), step == 7 || step == 8 ? 1u : 0u) << scope;
  }
  EXPECT_EQ(first.count("aten::addmm"), 1u);
  const std::string table = profiler.table();
  EXPECT_NE(table.find("CPU ops (self time)"), std::string::npos) << table;
  EXPECT_NE(table.find("aten::addmm"), std::string::npos) << table;
}

TEST(StepProfilerTest, BadSchedulesAreErrors) {
  fabric::StepProfilerOptions o;
  o.active = 0;
  EXPECT_THROW(fabric::StepProfiler{o}, fabric::Error);
  o.active = 1;
  o.cpu = false;
  EXPECT_THROW(fabric::StepProfiler{o}, fabric::Error);
  fabric::StepProfilerOptions fine;
  fine.dir = fs::path(::testing::TempDir()) / "unused";
  fabric::StepProfiler idle(fine);
  EXPECT_EQ(idle.table(), "");  // nothing recorded yet
}

}  // namespace
