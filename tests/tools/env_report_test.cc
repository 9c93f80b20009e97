#include "tools/env_report.h"

#include <map>

#include <gtest/gtest.h>

#include "tests/run_command.h"
#include "tools/env_resolve.h"

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

fabric::MachineFacts cpu_machine(std::map<std::string, std::string> env = {}) {
  fabric::MachineFacts facts;
  facts.environment = [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  return facts;
}

std::map<std::string, std::string> precisions(const fabric::tools::FabricResolution& r) {
  return {r.precisions.begin(), r.precisions.end()};
}

TEST(FabricResolutionTest, CpuMachineRunsOneLocalProcessAndListsPrecisionsWithReasons) {
  const auto r = fabric::tools::resolve_here("", {}, cpu_machine());
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.environment, "local");
  EXPECT_FALSE(r.external_launcher);
  EXPECT_EQ(r.world_size, 1);
  EXPECT_EQ(r.accelerator, "cpu");
  EXPECT_EQ(r.strategy, "single_device");
  EXPECT_EQ(r.precision, "32-true");
  auto p = precisions(r);
  ASSERT_EQ(p.size(), 6u);
  EXPECT_EQ(p["32-true"], "yes");
  EXPECT_EQ(p["16-mixed"], "yes, runs as 32-true");  // bf16 would be emulated on this CPU
  EXPECT_EQ(p["bf16-mixed"], "yes (emulated: several times slower than 32-true)");
  EXPECT_EQ(p["16-true"].rfind("no: '16-true' is not supported on CPU", 0), 0u) << p["16-true"];
  EXPECT_EQ(r.cpu_bf16, "emulated (this CPU has no avx512_bf16 or amx_bf16 instructions)");
  const std::string text = fabric::tools::format_text(r);
  EXPECT_NE(text.find("  strategy                single_device\n"), std::string::npos) << text;

  auto native = cpu_machine();
  native.cpu.native_bf16 = true;
  native.cpu.bf16_flags = "amx_bf16";
  native.cpu.online = native.cpu.affinity = 8;
  const auto n = fabric::tools::resolve_here("", {"fabric.devices=2"}, native);
  p = precisions(n);
  EXPECT_EQ(p["16-mixed"], "yes, runs as bf16-mixed");
  EXPECT_EQ(p["bf16-mixed"], "yes");
  EXPECT_EQ(n.cpu_bf16, "native (amx_bf16)");
  EXPECT_EQ(n.threads, 4);
  const std::string native_text = fabric::tools::format_text(n);
  EXPECT_NE(native_text.find("  threads per process     4 (auto: 8 CPUs / 2 processes sharing "
                             "them)\n"),
            std::string::npos)
      << native_text;
}

TEST(FabricResolutionTest, LauncherVariablesGiveTheRanks) {
  const auto r = fabric::tools::resolve_here(
      "", {"fabric.strategy=ddp"},
      cpu_machine(
          {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_PORT", "29511"}}));
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.environment, "env");
  EXPECT_TRUE(r.external_launcher);
  EXPECT_EQ(r.world_size, 2);
  EXPECT_EQ(r.global_rank, 1);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.strategy, "ddp");
  EXPECT_EQ(fabric::tools::to_json(r)["precisions"]["bf16-true"],
            "yes (emulated: several times slower than 32-true)");
}

TEST(FabricResolutionTest, AConfigThatCannotRunHereSaysWhy) {
  const auto r = fabric::tools::resolve_here("", {"fabric.accelerator=cuda"}, cpu_machine());
  EXPECT_NE(r.error.find("fabric.accelerator"), std::string::npos) << r.error;
  EXPECT_NE(fabric::tools::format_text(r).find("  error "), std::string::npos);
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

TEST(EnvBinaryTest, ResolvesAShippedConfigAndRejectsBadOverrides) {
  auto [code, out] = run_env("--config=ddp.yaml");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("Fabric would use (config: ddp.yaml)"), std::string::npos) << out;
  EXPECT_NE(out.find("  strategy                ddp\n"), std::string::npos) << out;
  auto bad = run_env("fabric.precision=16-mixd");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("did you mean '16-mixed'?"), std::string::npos) << bad.out;
}

}  // namespace
