#include "tools/env_report.h"

#include <gtest/gtest.h>

#include "tests/run_command.h"

namespace {

using fabric::BuildInfo;
using fabric::RuntimeInfo;

BuildInfo Build(const std::string& headers, bool cuda) {
  BuildInfo b;
  b.libtorch_headers = headers;
  b.cuda_compiled = cuda;
  return b;
}

RuntimeInfo Runtime(const std::string& version, bool has_cuda, int devices) {
  RuntimeInfo r;
  r.libtorch_version = version;
  r.libtorch_dir = "/opt/torch/lib";
  r.libtorch_has_cuda = has_cuda;
  for (int i = 0; i < devices; ++i) {
    fabric::CudaDeviceInfo d;
    d.index = i;
    d.name = "GPU" + std::to_string(i);
    d.capability_major = 9;
    r.devices.push_back(d);
  }
  r.cuda_available = devices > 0;
  return r;
}

TEST(EnvReportTest, HealthyGpuMachineHasNoWarnings) {
  EXPECT_TRUE(fabric::tools::diagnose_environment(Build("2.11.0", true), Runtime("2.11.0", true, 2))
                  .empty());
}

TEST(EnvReportTest, VersionMismatchNamesBothVersionsAndTheFix) {
  auto w = fabric::tools::diagnose_environment(Build("2.11.0", false), Runtime("2.10.1", false, 0));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("2.10.1"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("/opt/torch/lib"), std::string::npos) << w[0];
  EXPECT_NE(w[0].find("torch==2.11.0"), std::string::npos) << w[0];
}

TEST(EnvReportTest, CudaBinaryOnCpuOnlyLibTorchIsFlagged) {
  auto w = fabric::tools::diagnose_environment(Build("2.11.0", true), Runtime("2.11.0", false, 0));
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("--config=cpu_only"), std::string::npos) << w[0];
}

TEST(EnvReportTest, TextAndJsonListEveryDevice) {
  fabric::tools::EnvReport report;
  report.build = Build("2.11.0", true);
  report.runtime = Runtime("2.11.0", true, 2);
  const std::string text = fabric::tools::format_text(report);
  EXPECT_NE(text.find("device 1"), std::string::npos) << text;
  EXPECT_NE(text.find("GPU1, compute capability 9.0"), std::string::npos) << text;
  const nlohmann::json json = fabric::tools::to_json(report);
  ASSERT_EQ(json["cuda"]["devices"].size(), 2u);
  EXPECT_EQ(json["cuda"]["devices"][1]["compute_capability"], "9.0");
  EXPECT_TRUE(json["cuda"]["cudnn_version"].is_null());
}

// Runs the real //tools:env binary (a data dependency).
fabric::testing::CommandResult run_env(const std::string& args) {
  return fabric::testing::run_command("tools/env " + args);
}

TEST(EnvBinaryTest, JsonReportDescribesThisMachineAndIsStamped) {
  auto [code, out] = run_env("--json");
  ASSERT_EQ(code, 0) << out;
  const nlohmann::json json = nlohmann::json::parse(out);
  EXPECT_EQ(json["libtorch"]["version"], fabric::build_info().libtorch_headers);
  // The binary links //fabric/core:stamp: its revision is the git revision, not the test default.
  EXPECT_NE(json["fabric"]["revision"], "unstamped");
  EXPECT_EQ(json["fabric"]["revision"].get<std::string>().empty(), false);
  EXPECT_GT(json["host"]["logical_cpus"].get<int>(), 0);
}

TEST(EnvBinaryTest, UnknownArgumentIsAUsageError) {
  auto [code, out] = run_env("--jsn");
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("unknown argument '--jsn'"), std::string::npos) << out;
}

}  // namespace
