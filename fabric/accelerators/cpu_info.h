// fabric::CpuInfo: what this machine's CPUs offer one process: how many it may run on (affinity
// mask, cgroup CPU quota) and whether they compute bfloat16 natively. The Connector turns these
// facts into a thread budget per rank and a CPU precision; tests replace them (MachineFacts).
//
// Example:
//   fabric::CpuInfo cpu = fabric::query_cpu_info();
//   LOG(INFO) << cpu.usable() << " CPUs usable, bf16 "
//             << (cpu.native_bf16 ? "native" : "emulated");
#ifndef FABRIC_ACCELERATORS_CPU_INFO_H_
#define FABRIC_ACCELERATORS_CPU_INFO_H_

#include <cstdint>
#include <optional>
#include <string>

namespace fabric {

struct CpuInfo {
  int64_t online = 0;    // CPUs online on the machine; 0: unknown.
  int64_t affinity = 0;  // CPUs in this process's affinity mask (taskset, srun/mpirun binding).
  std::optional<double> quota;  // cgroup v2 cpu.max quota ÷ period (e.g. docker --cpus=2), if any.
  // The CPU multiplies bfloat16 in hardware: x86 flags avx512_bf16 or amx_bf16, Arm bf16. Without
  // them oneDNN and ATen emulate bf16 (about 3× slower than float32 for the main job, measured:
  // docs/benchmarks.md).
  bool native_bf16 = false;
  std::string bf16_flags;  // the flags that say so, e.g. "avx512_bf16 amx_bf16"; "" when none.
  std::string model;       // "Intel(R) Xeon(R) Platinum 8481C", for reports.

  // CPUs this process may keep busy: the affinity mask, capped by the cgroup quota (rounded up);
  // 0 when unknown.
  int64_t usable() const;
};

// Reads sched_getaffinity, sysconf, /sys/fs/cgroup/cpu.max and /proc/cpuinfo. Never throws: what
// cannot be read stays unknown.
CpuInfo query_cpu_info();

// Parses /proc/cpuinfo text: native bf16 flags (see CpuInfo) and the model name.
void parse_cpuinfo(const std::string& text, CpuInfo& info);

// A positive CPU or thread count as FABRIC_CPUS and OMP_NUM_THREADS give it ("4", or OpenMP's
// nested "4,2" → 4); nullopt for anything else.
std::optional<int64_t> parse_cpu_count(const std::string& text);

// Parses cgroup v2 cpu.max ("200000 100000" → 2.0; "max 100000" → nullopt).
std::optional<double> parse_cpu_max(const std::string& text);

}  // namespace fabric

#endif  // FABRIC_ACCELERATORS_CPU_INFO_H_
