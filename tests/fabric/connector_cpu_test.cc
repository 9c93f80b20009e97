// The Connector's CPU decisions, from replaceable machine facts: the precision a CPU can run fast
// (native or emulated bf16) and each rank's thread budget.
#include "fabric/connector.h"

#include <gtest/gtest.h>

#include <map>

#include "tests/fabric/connector_testing.h"

namespace {

using fabric::MachineFacts;
using fabric::PrecisionMode;
using namespace fabric::testing;  // NOLINT

MachineFacts cpu_with_bf16(bool native, std::map<std::string, std::string> env = {}) {
  MachineFacts m = cpu_machine();
  m.cpu.native_bf16 = native;
  m.cpu.bf16_flags = native ? "amx_bf16 avx512_bf16" : "";
  m.environment = env_of(std::move(env));
  return m;
}

// 16-mixed on CPU becomes bf16-mixed only where bf16 is native; elsewhere 32-true (bf16 emulated
// is several times slower than float32). Either way one warning line says what happened and why.
TEST(ConnectorTest, SixteenMixedOnCpuBecomesBf16OnlyWhereTheCpuComputesBf16) {
  auto s = resolve({"fabric.precision=16-mixed"}, cpu_with_bf16(true));
  EXPECT_EQ(s.precision, PrecisionMode::kBf16Mixed);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_EQ(s.warnings[0],
            "command line: fabric.precision: 16-mixed is not supported on CPU; using bf16-mixed "
            "(this CPU computes bf16 natively: amx_bf16 avx512_bf16)");

  s = resolve({"fabric.precision=16-mixed"}, cpu_with_bf16(false));
  EXPECT_EQ(s.precision, PrecisionMode::k32True);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_EQ(s.warnings[0],
            "command line: fabric.precision: 16-mixed is not supported on CPU and bf16 would be "
            "emulated (this CPU has no avx512_bf16 or amx_bf16 instructions; several times slower "
            "than float32); using 32-true. fabric.precision=bf16-mixed forces bf16");

  // oneDNN held to AVX2 on a bf16 machine computes like an AVX2-only one.
  s = resolve({"fabric.precision=16-mixed"}, cpu_with_bf16(true, {{"ONEDNN_MAX_CPU_ISA", "avx2"}}));
  EXPECT_EQ(s.precision, PrecisionMode::k32True);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("(ONEDNN_MAX_CPU_ISA=AVX2 holds oneDNN below bf16 instructions;"),
            std::string::npos)
      << s.warnings[0];
  s = resolve({"fabric.precision=16-mixed"},
              cpu_with_bf16(true, {{"ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX"}}));
  EXPECT_EQ(s.precision, PrecisionMode::kBf16Mixed);

  // An explicit bf16 request is kept, with a warning where it is emulated.
  for (const char* mode : {"bf16-mixed", "bf16-true"}) {
    s = resolve({std::string("fabric.precision=") + mode}, cpu_with_bf16(false));
    EXPECT_EQ(fabric::to_string(s.precision), mode);
    ASSERT_EQ(s.warnings.size(), 1u);
    EXPECT_EQ(s.warnings[0], std::string("command line: fabric.precision: ") + mode +
                                 " is emulated on this CPU (this CPU has no avx512_bf16 or "
                                 "amx_bf16 instructions): expect it several times slower than "
                                 "32-true");
    EXPECT_TRUE(
        resolve({std::string("fabric.precision=") + mode}, cpu_with_bf16(true)).warnings.empty());
  }
}

MachineFacts cpus(int64_t online, int64_t affinity, std::map<std::string, std::string> env = {}) {
  MachineFacts m = cpu_machine();
  m.cpu.online = online;
  m.cpu.affinity = affinity;
  m.environment = env_of(std::move(env));
  return m;
}

// Every rank's threads = the CPUs it may use / the ranks of the job on this machine sharing them.
TEST(ConnectorTest, ThreadBudgetSplitsTheCpusBetweenTheRanksSharingThem) {
  struct Case {
    std::vector<std::string> overrides;
    MachineFacts machine;
    int64_t threads;
    std::string reason;
  };
  const std::map<std::string, std::string> torchrun = {
      {"TORCHELASTIC_RUN_ID", "x"}, {"RANK", "1"},
      {"WORLD_SIZE", "8"},          {"LOCAL_RANK", "1"},
      {"LOCAL_WORLD_SIZE", "4"},    {"MASTER_PORT", "29500"}};
  MachineFacts quota = cpus(16, 16);
  quota.cpu.quota = 2.5;  // docker --cpus=2.5
  const std::vector<Case> cases = {
      {{}, cpus(2, 2), 2, "auto: 2 CPUs / 1 process sharing them"},
      {{"fabric.devices=2"}, cpus(2, 2), 1, "auto: 2 CPUs / 2 processes sharing them"},
      {{"fabric.devices=3"}, cpus(8, 8), 2, "auto: 8 CPUs / 3 processes sharing them"},
      {{"fabric.devices=4"}, cpus(2, 2), 1, "auto: 2 CPUs / 4 processes sharing them"},
      // taskset -c 0-3 on 16 CPUs: self-launched children share the parent's mask.
      {{"fabric.devices=2"}, cpus(16, 4), 2, "auto: 4 CPUs / 2 processes sharing them"},
      {{}, quota, 3, "auto: 3 CPUs / 1 process sharing them"},
      // A sweep running 2 runs at once gives each run half the machine.
      {{"fabric.devices=2"},
       cpus(16, 16, {{"FABRIC_CPUS", "8"}}),
       4,
       "auto: 8 CPUs (FABRIC_CPUS) / 2 processes sharing them"},
      // torchrun: 4 ranks on this machine, unbound.
      {{}, cpus(16, 16, torchrun), 4, "auto: 16 CPUs / 4 processes sharing them"},
      // ... bound to 4 disjoint cores each (mpirun --bind-to core, srun --cpu-bind).
      {{}, cpus(16, 4, torchrun), 4, "auto: 4 CPUs / 1 process sharing them"},
      // ... bound per socket: 2 sockets of 8, 2 ranks on each.
      {{}, cpus(16, 8, torchrun), 4, "auto: 8 CPUs / 2 processes sharing them"},
      // A launcher that does not say how many ranks run here: world / fabric.num_nodes.
      {{"fabric.num_nodes=2"},
       cpus(16, 16, {{"RANK", "0"}, {"WORLD_SIZE", "8"}, {"MASTER_PORT", "29500"}}),
       4,
       "auto: 16 CPUs / 4 processes sharing them"},
      {{},
       cpus(16, 16,
            {{"SLURM_NTASKS", "6"},
             {"SLURM_PROCID", "4"},
             {"SLURM_NODEID", "1"},
             {"SLURM_TASKS_PER_NODE", "4,2"},
             {"SLURM_NODELIST", "n[1-2]"},
             {"SLURM_JOB_ID", "12"}}),
       8,
       "auto: 16 CPUs / 2 processes sharing them"},
      // dp drives every device from one process.
      {{"fabric.strategy=dp"}, cpus(16, 16), 16, "auto: 16 CPUs / 1 process sharing them"},
      // Overrides: fabric.num_threads, then OMP_NUM_THREADS (OpenMP's nested form too).
      {{"fabric.devices=2", "fabric.num_threads=3"},
       cpus(2, 2, {{"OMP_NUM_THREADS", "1"}}),
       3,
       "fabric.num_threads"},
      {{"fabric.devices=2"}, cpus(8, 8, {{"OMP_NUM_THREADS", "6,2"}}), 6, "OMP_NUM_THREADS"},
      {{"fabric.devices=2"},
       cpus(8, 8, {{"OMP_NUM_THREADS", "lots"}}),
       4,
       "auto: 8 CPUs / 2 processes sharing them"},
      // Nothing known about the CPUs: LibTorch's own default stays.
      {{"fabric.devices=2"}, cpu_machine(), 0, ""},
  };
  for (const auto& c : cases) {
    const auto s = resolve(c.overrides, c.machine);
    std::string label;
    for (const auto& o : c.overrides) label += o + " ";
    EXPECT_EQ(s.num_threads, c.threads) << label << c.reason;
    EXPECT_EQ(s.threads_reason, c.reason) << label;
  }
}

}  // namespace
