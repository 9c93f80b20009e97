#include "fabric/launchers/job_progress.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "fabric/core/error.h"

namespace fabric {
namespace {

constexpr size_t kPageBytes = 4096;
constexpr int64_t kSlots = kPageBytes / sizeof(int64_t);

std::atomic_ref<int64_t> slot(int64_t* steps, int64_t i) {
  return std::atomic_ref<int64_t>(steps[i]);
}

std::optional<int64_t> integer(const std::optional<std::string>& text) {
  if (!text || text->empty()) return std::nullopt;
  char* end = nullptr;
  const long long v = std::strtoll(text->c_str(), &end, 10);
  if (*end != '\0') return std::nullopt;
  return v;
}

// The inherited page of a rank the agent started (nullptr otherwise), and this rank's slot.
struct RankPage {
  int64_t* steps = nullptr;
  int64_t rank = 0;
  RankPage() {
    auto var = [](const char* name) -> std::optional<std::string> {
      const char* v = std::getenv(name);
      return v != nullptr ? std::optional<std::string>(v) : std::nullopt;
    };
    const auto fd = integer(var("FABRIC_PROGRESS_FD"));
    const auto rank_var = integer(var("FABRIC_LOCAL_RANK"));
    if (!fd || !rank_var || *rank_var < 0 || *rank_var >= kSlots) return;
    void* p =
        mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, static_cast<int>(*fd), 0);
    if (p == MAP_FAILED) return;
    steps = static_cast<int64_t*>(p);
    rank = *rank_var;
  }
};

}  // namespace

JobProgress::JobProgress(int64_t world_size) : slots_(std::min<int64_t>(world_size, kSlots)) {
  fd_ = memfd_create("fabric-progress", 0);  // inherited by the children on purpose
  if (fd_ < 0) throw Error(std::string("JobProgress: memfd_create: ") + std::strerror(errno));
  if (ftruncate(fd_, kPageBytes) != 0) {
    const std::string why = std::strerror(errno);
    close(fd_);
    throw Error("JobProgress: ftruncate: " + why);
  }
  void* p = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (p == MAP_FAILED) {
    const std::string why = std::strerror(errno);
    close(fd_);
    throw Error("JobProgress: mmap: " + why);
  }
  steps_ = static_cast<int64_t*>(p);
  reset();
}

JobProgress::~JobProgress() {
  if (steps_ != nullptr) munmap(steps_, kPageBytes);
  if (fd_ >= 0) close(fd_);
}

int64_t JobProgress::furthest_step() const {
  int64_t furthest = -1;
  for (int64_t i = 0; i < slots_; ++i)
    furthest = std::max(furthest, slot(steps_, i).load(std::memory_order_relaxed));
  return furthest;
}

void JobProgress::reset() {
  for (int64_t i = 0; i < kSlots; ++i) slot(steps_, i).store(-1, std::memory_order_relaxed);
}

void publish_step(int64_t step) {
  static const RankPage page;
  if (page.steps != nullptr) slot(page.steps, page.rank).store(step, std::memory_order_relaxed);
}

int64_t restart_attempt(const EnvGetter& env) {
  if (auto n = integer(env("FABRIC_RESTART_COUNT"))) return *n;
  if (auto n = integer(env("TORCHELASTIC_RESTART_COUNT"))) return *n;
  return 0;
}

std::optional<int64_t> failed_attempt_step(const EnvGetter& env) {
  auto step = integer(env("FABRIC_FAILED_STEP"));
  if (step && *step < 0) return std::nullopt;
  return step;
}

std::optional<std::chrono::system_clock::time_point> job_start_time(const EnvGetter& env) {
  if (auto ns = integer(env("FABRIC_JOB_START_NS")))
    return std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::nanoseconds(*ns)));
  // Field 22 of /proc/PID/stat: start time in clock ticks after boot; /proc/stat's btime: boot
  // time in seconds since the epoch.
  std::ifstream stat("/proc/" + std::to_string(getppid()) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close_paren = text.rfind(')');
  if (close_paren == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close_paren + 2));  // from field 3 (state) on
  std::string field;
  for (int i = 3; i < 22 && fields >> field;) ++i;
  unsigned long long ticks = 0;
  if (!(fields >> ticks)) return std::nullopt;
  std::ifstream boot("/proc/stat");
  std::string line;
  long long btime = -1;
  while (std::getline(boot, line))
    if (line.rfind("btime ", 0) == 0) btime = std::atoll(line.c_str() + 6);
  const long hz = sysconf(_SC_CLK_TCK);
  if (btime < 0 || hz <= 0) return std::nullopt;
  const auto since_boot = std::chrono::duration<double>(static_cast<double>(ticks) / hz);
  return std::chrono::system_clock::time_point(std::chrono::seconds(btime)) +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(since_boot);
}

}  // namespace fabric
