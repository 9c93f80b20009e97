#include "tools/env_report.h"

#include <gnu/libc-version.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "tools/report_table.h"

namespace fabric::tools {
namespace {

std::string read_key(const std::string& path, const std::string& key, char sep) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    auto pos = line.find(sep);
    if (pos == std::string::npos) continue;
    std::string value = line.substr(pos + 1);
    value.erase(0, value.find_first_not_of(" \t\""));
    value.erase(value.find_last_not_of(" \t\"") + 1);
    return value;
  }
  return "unknown";
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(bytes) / (1LL << 30));
  return buf;
}

std::string yes_no(bool b) { return b ? "yes" : "no"; }

std::string or_none(const std::optional<std::string>& s) { return s.value_or("none"); }

}  // namespace

HostInfo query_host_info() {
  HostInfo host;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0) host.hostname = name;
  host.os = read_key("/etc/os-release", "PRETTY_NAME=", '=');
  utsname u{};
  host.kernel = uname(&u) == 0 ? u.release : "unknown";
  host.glibc = gnu_get_libc_version();
  host.cpu_model = read_key("/proc/cpuinfo", "model name", ':');
  host.logical_cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  host.memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  return host;
}

std::vector<std::string> diagnose_environment(const BuildInfo& build, const RuntimeInfo& runtime) {
  std::vector<std::string> warnings;
  if (runtime.libtorch_version != build.libtorch_headers) {
    warnings.push_back("LibTorch " + runtime.libtorch_version + " is loaded from " +
                       runtime.libtorch_dir + " but this binary was compiled against " +
                       build.libtorch_headers + ": install torch==" + build.libtorch_headers +
                       " there or rebuild");
  }
  if (build.cuda_compiled && !runtime.libtorch_has_cuda) {
    warnings.push_back(
        "compiled with CUDA support but the loaded LibTorch has no CUDA part: use a "
        "CUDA build of torch (or build with --config=cpu_only)");
  }
  if (runtime.libtorch_has_cuda && build.cuda_compiled && !runtime.cuda_available) {
    warnings.push_back(
        "CUDA LibTorch but no usable CUDA device (no GPU, no driver, or "
        "CUDA_VISIBLE_DEVICES hides them): training runs on the CPU");
  }
  return warnings;
}

EnvReport collect_env_report() {
  EnvReport report;
  report.build = build_info();
  report.runtime = query_runtime_info();
  report.host = query_host_info();
  report.warnings = diagnose_environment(report.build, report.runtime);
  return report;
}

std::string format_text(const EnvReport& r) {
  ReportTable t;
  t.section("Fabric++");
  t.row("revision", r.build.revision);
  t.row("compiler", r.build.compiler);
  t.row("C++ standard", std::to_string(r.build.cxx_standard));
  t.row("C++11 ABI", "_GLIBCXX_USE_CXX11_ABI=" + std::to_string(r.build.cxx11_abi));
  t.row("build", std::string(r.build.optimized ? "optimized" : "debug") + ", CUDA code " +
                     (r.build.cuda_compiled ? "compiled in" : "compiled out (cpu_only)"));
  t.section("LibTorch");
  t.row("headers", r.build.libtorch_headers);
  t.row("loaded", r.runtime.libtorch_version +
                      (r.runtime.libtorch_commit.empty()
                           ? ""
                           : " (commit " + r.runtime.libtorch_commit.substr(0, 12) + ")"));
  t.row("path", r.runtime.libtorch_dir);
  t.row("CPU capability", r.runtime.cpu_capability);
  t.row("intra-op threads", std::to_string(r.runtime.intra_op_threads));
  t.row("inter-op threads", std::to_string(r.runtime.inter_op_threads));
  t.section("CUDA");
  t.row("CUDA build", yes_no(r.runtime.libtorch_has_cuda));
  t.row("CUDA runtime", or_none(r.runtime.cuda_runtime_version));
  t.row("cuDNN", or_none(r.runtime.cudnn_version));
  t.row("NCCL", or_none(r.runtime.nccl_version));
  t.row("CUDA available", yes_no(r.runtime.cuda_available));
  t.row("device count", std::to_string(r.runtime.devices.size()));
  for (const auto& d : r.runtime.devices) {
    t.row("device " + std::to_string(d.index),
          d.name + ", compute capability " + std::to_string(d.capability_major) + "." +
              std::to_string(d.capability_minor) + ", " + gib(d.total_memory_bytes) + ", " +
              std::to_string(d.multiprocessor_count) + " SMs, bf16 " + yes_no(d.supports_bf16));
  }
  t.section("Host");
  t.row("hostname", r.host.hostname);
  t.row("OS", r.host.os);
  t.row("kernel", r.host.kernel);
  t.row("glibc", r.host.glibc);
  t.row("CPU", r.host.cpu_model);
  t.row("logical CPUs", std::to_string(r.host.logical_cpus));
  t.row("memory", gib(r.host.memory_bytes));
  std::string text = t.str();
  for (const auto& w : r.warnings) text += "WARNING: " + w + "\n";
  return text;
}

nlohmann::json to_json(const EnvReport& r) {
  nlohmann::json devices = nlohmann::json::array();
  for (const auto& d : r.runtime.devices) {
    devices.push_back({{"index", d.index},
                       {"name", d.name},
                       {"compute_capability", std::to_string(d.capability_major) + "." +
                                                  std::to_string(d.capability_minor)},
                       {"total_memory_bytes", d.total_memory_bytes},
                       {"multiprocessors", d.multiprocessor_count},
                       {"bf16", d.supports_bf16}});
  }
  auto opt = [](const std::optional<std::string>& s) -> nlohmann::json {
    return s ? nlohmann::json(*s) : nlohmann::json(nullptr);
  };
  return {
      {"fabric",
       {{"revision", r.build.revision},
        {"compiler", r.build.compiler},
        {"cxx_standard", r.build.cxx_standard},
        {"cxx11_abi", r.build.cxx11_abi},
        {"optimized", r.build.optimized},
        {"cuda_compiled", r.build.cuda_compiled}}},
      {"libtorch",
       {{"headers_version", r.build.libtorch_headers},
        {"version", r.runtime.libtorch_version},
        {"commit", r.runtime.libtorch_commit},
        {"path", r.runtime.libtorch_dir},
        {"cpu_capability", r.runtime.cpu_capability},
        {"intra_op_threads", r.runtime.intra_op_threads},
        {"inter_op_threads", r.runtime.inter_op_threads}}},
      {"cuda",
       {{"cuda_build", r.runtime.libtorch_has_cuda},
        {"runtime_version", opt(r.runtime.cuda_runtime_version)},
        {"cudnn_version", opt(r.runtime.cudnn_version)},
        {"nccl_version", opt(r.runtime.nccl_version)},
        {"available", r.runtime.cuda_available},
        {"devices", devices}}},
      {"host",
       {{"hostname", r.host.hostname},
        {"os", r.host.os},
        {"kernel", r.host.kernel},
        {"glibc", r.host.glibc},
        {"cpu", r.host.cpu_model},
        {"logical_cpus", r.host.logical_cpus},
        {"memory_bytes", r.host.memory_bytes}}},
      {"warnings", r.warnings},
  };
}

}  // namespace fabric::tools
