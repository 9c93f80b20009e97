#include "fabric/accelerators/cpu_info.h"

#include <sched.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace fabric {
namespace {

std::string read_file(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  if (in) text << in.rdbuf();
  return text.str();
}

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

}  // namespace

int64_t CpuInfo::usable() const {
  int64_t n = affinity > 0 ? affinity : online;
  if (quota && *quota > 0) {
    const auto capped = static_cast<int64_t>(std::ceil(*quota - 1e-9));
    n = n > 0 ? std::min(n, std::max<int64_t>(capped, 1)) : std::max<int64_t>(capped, 1);
  }
  return n;
}

void parse_cpuinfo(const std::string& text, CpuInfo& info) {
  std::istringstream lines(text);
  std::string line;
  std::set<std::string> found;
  // One processor's entry is enough: the flags of every core of a machine are the same.
  bool seen_flags = false;
  while (std::getline(lines, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    const std::string value = trim(line.substr(colon + 1));
    if (key == "model name" && info.model.empty()) info.model = value;
    if ((key == "flags" || key == "Features") && !seen_flags) {
      seen_flags = true;
      std::istringstream words(value);
      std::string w;
      while (words >> w)
        if (w == "avx512_bf16" || w == "amx_bf16" || w == "bf16") found.insert(w);
    }
  }
  info.bf16_flags.clear();
  for (const auto& f : found) info.bf16_flags += (info.bf16_flags.empty() ? "" : " ") + f;
  info.native_bf16 = !found.empty();
}

std::optional<int64_t> parse_cpu_count(const std::string& text) {
  int64_t n = 0;
  const char* begin = text.c_str();
  const char* end = begin + text.size();
  auto [stop, ec] = std::from_chars(begin, end, n);
  if (ec != std::errc() || n < 1 || (stop != end && *stop != ',')) return std::nullopt;
  return n;
}

std::optional<double> parse_cpu_max(const std::string& text) {
  std::istringstream in(text);
  std::string quota;
  double period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return std::nullopt;
  try {
    const double q = std::stod(quota);
    if (q <= 0) return std::nullopt;
    return q / period;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

CpuInfo query_cpu_info() {
  CpuInfo info;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  info.online = online > 0 ? online : 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) info.affinity = CPU_COUNT(&set);
  info.quota = parse_cpu_max(read_file("/sys/fs/cgroup/cpu.max"));
  parse_cpuinfo(read_file("/proc/cpuinfo"), info);
  return info;
}

}  // namespace fabric
