#include "tools/env_report.h"

#include <gnu/libc-version.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace fabric::tools {
namespace {

std::string ReadKey(const std::string& path, const std::string& key, char sep) {
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

std::string Gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f GiB", static_cast<double>(bytes) / (1LL << 30));
  return buf;
}

std::string YesNo(bool b) { return b ? "yes" : "no"; }

std::string OrNone(const std::optional<std::string>& s) { return s.value_or("none"); }

class Table {
 public:
  void Section(const std::string& title) { out_ << title << "\n"; }
  void Row(const std::string& key, const std::string& value) {
    out_ << "  " << key << std::string(key.size() < 24 ? 24 - key.size() : 1, ' ') << value << "\n";
  }
  std::string str() const { return out_.str(); }

 private:
  std::ostringstream out_;
};

}  // namespace

HostInfo QueryHostInfo() {
  HostInfo host;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) == 0) host.hostname = name;
  host.os = ReadKey("/etc/os-release", "PRETTY_NAME=", '=');
  utsname u{};
  host.kernel = uname(&u) == 0 ? u.release : "unknown";
  host.glibc = gnu_get_libc_version();
  host.cpu_model = ReadKey("/proc/cpuinfo", "model name", ':');
  host.logical_cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  host.memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  return host;
}

std::vector<std::string> DiagnoseEnvironment(const BuildInfo& build, const RuntimeInfo& runtime) {
  std::vector<std::string> warnings;
  if (runtime.libtorch_version != build.libtorch_headers) {
    warnings.push_back("LibTorch " + runtime.libtorch_version + " is loaded from " +
                       runtime.libtorch_dir + " but this binary was compiled against " +
                       build.libtorch_headers + ": install torch==" + build.libtorch_headers +
                       " there or rebuild");
  }
  if (build.cuda_compiled && !runtime.libtorch_has_cuda) {
    warnings.push_back("compiled with CUDA support but the loaded LibTorch has no CUDA part: use a "
                       "CUDA build of torch (or build with --config=cpu_only)");
  }
  if (runtime.libtorch_has_cuda && build.cuda_compiled && !runtime.cuda_available) {
    warnings.push_back("CUDA LibTorch but no usable CUDA device (no GPU, no driver, or "
                       "CUDA_VISIBLE_DEVICES hides them): training runs on the CPU");
  }
  return warnings;
}

EnvReport CollectEnvReport() {
  EnvReport report;
  report.build = GetBuildInfo();
  report.runtime = QueryRuntimeInfo();
  report.host = QueryHostInfo();
  report.warnings = DiagnoseEnvironment(report.build, report.runtime);
  return report;
}

std::string FormatText(const EnvReport& r) {
  Table t;
  t.Section("Fabric++");
  t.Row("revision", r.build.revision);
  t.Row("compiler", r.build.compiler);
  t.Row("C++ standard", std::to_string(r.build.cxx_standard));
  t.Row("C++11 ABI", "_GLIBCXX_USE_CXX11_ABI=" + std::to_string(r.build.cxx11_abi));
  t.Row("build", std::string(r.build.optimized ? "optimized" : "debug") + ", CUDA code " +
                     (r.build.cuda_compiled ? "compiled in" : "compiled out (cpu_only)"));
  t.Section("LibTorch");
  t.Row("headers", r.build.libtorch_headers);
  t.Row("loaded", r.runtime.libtorch_version +
                      (r.runtime.libtorch_commit.empty()
                           ? ""
                           : " (commit " + r.runtime.libtorch_commit.substr(0, 12) + ")"));
  t.Row("path", r.runtime.libtorch_dir);
  t.Row("CPU capability", r.runtime.cpu_capability);
  t.Row("intra-op threads", std::to_string(r.runtime.intra_op_threads));
  t.Row("inter-op threads", std::to_string(r.runtime.inter_op_threads));
  t.Section("CUDA");
  t.Row("CUDA build", YesNo(r.runtime.libtorch_has_cuda));
  t.Row("CUDA runtime", OrNone(r.runtime.cuda_runtime_version));
  t.Row("cuDNN", OrNone(r.runtime.cudnn_version));
  t.Row("NCCL", OrNone(r.runtime.nccl_version));
  t.Row("CUDA available", YesNo(r.runtime.cuda_available));
  t.Row("device count", std::to_string(r.runtime.devices.size()));
  for (const auto& d : r.runtime.devices) {
    t.Row("device " + std::to_string(d.index),
          d.name + ", compute capability " + std::to_string(d.capability_major) + "." +
              std::to_string(d.capability_minor) + ", " + Gib(d.total_memory_bytes) + ", " +
              std::to_string(d.multiprocessor_count) + " SMs, bf16 " + YesNo(d.supports_bf16));
  }
  t.Section("Host");
  t.Row("hostname", r.host.hostname);
  t.Row("OS", r.host.os);
  t.Row("kernel", r.host.kernel);
  t.Row("glibc", r.host.glibc);
  t.Row("CPU", r.host.cpu_model);
  t.Row("logical CPUs", std::to_string(r.host.logical_cpus));
  t.Row("memory", Gib(r.host.memory_bytes));
  std::string text = t.str();
  for (const auto& w : r.warnings) text += "WARNING: " + w + "\n";
  return text;
}

nlohmann::json ToJson(const EnvReport& r) {
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
