#include "fabric/distributed/shm_segment.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <type_traits>

#include "fabric/core/error.h"

namespace fabric::distributed {
namespace {

using Clock = std::chrono::steady_clock;

// The segment: this header, then world_size per-rank chunks, then two result chunks (used in
// alternate rounds, so a rank may write round k+1's result while another still copies round k's).
struct alignas(64) Header {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> broken;                  // a rank gave up waiting: every wait fails at once
  alignas(64) std::atomic<uint32_t> generation;  // the futex word
};
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
static_assert(std::atomic<uint32_t>::is_always_lock_free);
constexpr int64_t kHeaderBytes = 4096;
// After the Header, in the same page: per rank what it passes to the running all_reduce (its
// element count, and dtype and op), compared by every rank after the first barrier. Worlds
// larger than the page holds (over 240 ranks on one host) skip the comparison.
constexpr int64_t kCallOffset = 256;
constexpr int64_t kMaxCheckedRanks = (kHeaderBytes - kCallOffset) / 16;

std::string errno_text() { return std::strerror(errno); }

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::milliseconds most) {
  timespec ts{static_cast<time_t>(most.count() / 1000),
              static_cast<long>(most.count() % 1000) * 1000000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// CPUs this process may run on (its affinity mask; containers often narrow it).
int64_t usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return std::max<int64_t>(1, std::thread::hardware_concurrency());
}
// The mapped segment and the all-reduce over it; used by the worker thread only.
class Segment final : public ShmSegment {
 public:
  Segment(void* base, int64_t bytes, int64_t rank, int64_t world, int64_t chunk_bytes,
          std::chrono::milliseconds timeout)
      : base_(static_cast<char*>(base)),
        bytes_(bytes),
        rank_(rank),
        world_(world),
        chunk_bytes_(chunk_bytes),
        timeout_(timeout) {}
  ~Segment() override { munmap(base_, static_cast<size_t>(bytes_)); }
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  void stop() override {
    stopping_ = true;
    futex_wake_all(&header()->generation);
  }

  // Chunk by chunk: publish what the other ranks reduce (all of this rank's chunk but its own
  // share), reduce its own share over every rank (its own part read in place) into the result
  // area and into the tensor, then fetch the other shares' results. Per rank that moves about two
  // tensors' worth of bytes each way, not three.
  void all_reduce(const at::Tensor& tensor, c10d::ReduceOp::RedOpType op) override {
    collective_ = "all_reduce";
    if (world_ == 1) return;
    at::Tensor data = tensor.is_contiguous() ? tensor : tensor.contiguous();
    const int64_t element = data.element_size();
    const int64_t per_chunk = chunk_bytes_ / element;
    const bool check = world_ <= kMaxCheckedRanks;
    if (check) {
      call(rank_)[0] = static_cast<uint64_t>(data.numel());
      call(rank_)[1] = static_cast<uint64_t>(data.scalar_type()) << 8 | static_cast<uint64_t>(op);
    }
    // At least one round, an empty tensor's too: every rank passes the first barrier and the
    // comparison, whatever it passed.
    for (int64_t offset = 0; offset == 0 || offset < data.numel(); offset += per_chunk) {
      const int64_t n = std::min(per_chunk, data.numel() - offset);
      char* mine = static_cast<char*>(data.data_ptr()) + offset * element;
      const int64_t step = ((n + world_ - 1) / world_ + 15) / 16 * 16;  // 16-element shares
      const int64_t lo = std::min(n, rank_ * step), hi = std::min(n, lo + step);
      auto all_but_share = [&](char* to, const char* from) {
        if (n == 0) return;  // an empty tensor's round: its data pointer may be null
        std::memcpy(to, from, static_cast<size_t>(lo * element));
        std::memcpy(to + hi * element, from + hi * element,
                    static_cast<size_t>((n - hi) * element));
      };
      all_but_share(slot(rank_), mine);
      barrier();
      if (offset == 0 && check) compare_calls();
      if (hi > lo) reduce_share(op, data.scalar_type(), lo, hi, mine);
      barrier();
      all_but_share(mine, result(round_));
      ++round_;
    }
    if (!data.is_same(tensor)) tensor.copy_(data);
  }

  // Round by round over pieces of the output: every rank publishes, side by side, its piece for
  // every destination rank; each rank reduces its own destination's pieces over every rank's
  // slot straight into its output. One barrier pair per round; no result area.
  void reduce_scatter(const at::Tensor& out, const at::Tensor& in,
                      c10d::ReduceOp::RedOpType op) override {
    collective_ = "reduce_scatter";
    const at::Tensor src = in.contiguous();
    at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
    const int64_t k = dst.numel();
    if (world_ == 1) {
      dst.view(-1).copy_(src.view(-1));
    } else {
      const int64_t element = src.element_size();
      const int64_t per_piece = std::max<int64_t>(1, chunk_bytes_ / element / world_);
      const char* from = static_cast<const char*>(src.data_ptr());
      char* to = static_cast<char*>(dst.data_ptr());
      for (int64_t offset = 0; offset < k; offset += per_piece) {
        const int64_t n = std::min(per_piece, k - offset);
        for (int64_t d = 0; d < world_; ++d) {
          std::memcpy(slot(rank_) + d * n * element, from + (d * k + offset) * element,
                      static_cast<size_t>(n * element));
        }
        barrier();
        reduce_ranks(op, src.scalar_type(), n, to + offset * element,
                     [&](int64_t rank) -> const char* { return slot(rank) + rank_ * n * element; });
        barrier();  // the slots are rewritten next round
      }
    }
    if (!dst.is_same(out)) out.copy_(dst);
  }

  void all_gather(const at::Tensor& out, const at::Tensor& in) override {
    collective_ = "all_gather";
    const at::Tensor src = in.contiguous();
    at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
    const int64_t k = src.numel();
    if (world_ == 1) {
      dst.view(-1).copy_(src.view(-1));
    } else {
      const int64_t element = src.element_size();
      const int64_t per_piece = chunk_bytes_ / element;
      const char* from = static_cast<const char*>(src.data_ptr());
      char* to = static_cast<char*>(dst.data_ptr());
      for (int64_t offset = 0; offset < k; offset += per_piece) {
        const int64_t n = std::min(per_piece, k - offset);
        std::memcpy(slot(rank_), from + offset * element, static_cast<size_t>(n * element));
        barrier();
        for (int64_t r = 0; r < world_; ++r) {
          std::memcpy(to + (r * k + offset) * element, slot(r), static_cast<size_t>(n * element));
        }
        barrier();
      }
    }
    if (!dst.is_same(out)) out.copy_(dst);
  }

 private:
  Header* header() { return reinterpret_cast<Header*>(base_); }
  char* slot(int64_t rank) { return base_ + kHeaderBytes + rank * chunk_bytes_; }
  char* result(int64_t round) { return slot(world_ + (round & 1)); }
  uint64_t* call(int64_t rank) {
    return reinterpret_cast<uint64_t*>(base_ + kCallOffset + rank * 16);
  }

  // Every rank must pass a tensor of the same size and dtype, and the same op: otherwise each
  // splits its own count into chunks and reads the others' stale bytes (no error, garbage). Every
  // rank reads every rank's entry after the same barrier, so all of them throw, none waits.
  void compare_calls() {
    static const char* const kOps[] = {"sum",  "avg", "product", "min",       "max",
                                       "band", "bor", "bxor",    "premul_sum"};
    const auto describe = [&](int64_t r) {
      const uint64_t op = call(r)[1] & 0xFF;
      return "rank " + std::to_string(r) + ": " + std::to_string(call(r)[0]) + " " +
             c10::toString(static_cast<at::ScalarType>(call(r)[1] >> 8)) + " elements, " +
             (op < 9 ? kOps[op] : "op " + std::to_string(op));
    };
    for (int64_t r = 1; r < world_; ++r)
      if (call(r)[0] != call(0)[0] || call(r)[1] != call(0)[1])
        fail("the ranks passed different tensors (" + describe(0) + "; " + describe(r) +
             "): every rank must all-reduce a tensor of the same size and dtype with the same op");
  }

  // Elements [lo, hi) of the chunk, reduced in rank order into the result area and into `mine`.
  void reduce_share(c10d::ReduceOp::RedOpType op, at::ScalarType dtype, int64_t lo, int64_t hi,
                    char* mine) {
    const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
    char* out_bytes = result(round_) + lo * element;
    reduce_ranks(op, dtype, hi - lo, out_bytes, [&](int64_t rank) -> const char* {
      return (rank == rank_ ? mine : slot(rank)) + lo * element;
    });
    std::memcpy(mine + lo * element, out_bytes, static_cast<size_t>((hi - lo) * element));
  }

  // out[i] = input(0)[i] op input(1)[i] op ... op input(N-1)[i] for i < n, in rank order, by plain
  // loops (no ATen op: this runs on the worker thread, where an intra-op thread team would compete
  // with the training threads). Per element the same IEEE operation as ATen's, so the same bits.
  // `out` may not alias an input.
  template <typename Input>
  void reduce_ranks(c10d::ReduceOp::RedOpType op, at::ScalarType dtype, int64_t n, char* out_bytes,
                    Input input_bytes) {
    AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "fabric_shm_reduce", [&] {
      auto input = [&](int64_t rank) {
        return reinterpret_cast<const scalar_t*>(input_bytes(rank));
      };
      auto* out = reinterpret_cast<scalar_t*>(out_bytes);
      for (int64_t r = 1; r < world_; ++r) {
        const scalar_t* a = r == 1 ? input(0) : out;
        const scalar_t* b = input(r);
        switch (op) {
          case c10d::ReduceOp::SUM:
            for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
            break;
          case c10d::ReduceOp::PRODUCT:
            for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
            break;
          case c10d::ReduceOp::MIN:  // NaN wins, as in at::minimum
            for (int64_t i = 0; i < n; ++i) out[i] = nan_or(a[i], b[i], b[i] < a[i] ? b[i] : a[i]);
            break;
          default:
            for (int64_t i = 0; i < n; ++i) out[i] = nan_or(a[i], b[i], b[i] > a[i] ? b[i] : a[i]);
            break;
        }
      }
    });
  }

  template <typename T>
  static T nan_or(T a, T b, T otherwise) {
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, c10::Half> ||
                  std::is_same_v<T, c10::BFloat16>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return otherwise;
  }

  // Sense-counting barrier over every rank: the last to arrive bumps the generation and wakes
  // the others, who spin briefly, then sleep on the futex in slices until it moves.
  void barrier() {
    Header* h = header();
    if (h->broken.load(std::memory_order_acquire) != 0) fail("another rank gave up waiting");
    const uint32_t generation = h->generation.load(std::memory_order_acquire);
    if (h->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(world_)) {
      h->arrived.store(0, std::memory_order_relaxed);
      h->generation.fetch_add(1, std::memory_order_release);
      futex_wake_all(&h->generation);
      return;
    }
    for (int spin = 0; spin < spins_; ++spin) {
      if (h->generation.load(std::memory_order_acquire) != generation) return;
      cpu_relax();
    }
    const auto deadline = Clock::now() + timeout_;
    while (h->generation.load(std::memory_order_acquire) == generation) {
      if (stopping_) fail("the process group was shut down");
      if (h->broken.load(std::memory_order_acquire) != 0) fail("another rank gave up waiting");
      if (Clock::now() >= deadline) {
        h->broken.store(1, std::memory_order_release);
        futex_wake_all(&h->generation);
        fail("timed out after " + std::to_string(timeout_.count()) +
             " ms waiting for the other ranks");
      }
      futex_wait(&h->generation, generation, std::chrono::milliseconds(100));
    }
  }

  [[noreturn]] void fail(const std::string& why) {
    throw Error(std::string("shared-memory ") + collective_ + " on rank " + std::to_string(rank_) +
                ": " + why);
  }

  char* base_;
  int64_t bytes_, rank_, world_, chunk_bytes_;
  const char* collective_ = "all_reduce";  // the one running, for errors
  std::chrono::milliseconds timeout_;
  int64_t round_ = 0;
  std::atomic<bool> stopping_{false};
  // Spinning before sleeping on the futex pays when every rank has a CPU (2 ranks, 2 vCPUs: 19 MB
  // in 2.9 ms with, 7.3 without); with more ranks than CPUs it steals time from the rank being
  // waited for (4 ranks, 2 vCPUs: 24.7 ms with, 12.2 without). docs/benchmarks.md.
  int spins_ = world_ <= usable_cpus() ? 4000 : 0;
};

}  // namespace

std::string ShmSegment::map(const std::string& name, bool create, int64_t bytes, void** base) {
  const int fd = create ? shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)
                        : shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0)
    return "cannot " + std::string(create ? "create" : "open") + " /dev/shm" + name + ": " +
           errno_text();
  std::string why;
  struct stat st {};
  if (create && ftruncate(fd, bytes) != 0) {
    why = "cannot size /dev/shm" + name + ": " + errno_text();
  } else if (create && (errno = posix_fallocate(fd, 0, bytes)) != 0) {
    why = "cannot reserve " + std::to_string(bytes >> 20) + " MiB in /dev/shm: " + errno_text();
  } else if (fstat(fd, &st) != 0 || st.st_size != bytes) {
    why = "/dev/shm" + name + " has " + std::to_string(st.st_size) + " bytes, not " +
          std::to_string(bytes);
  } else {
    *base = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (*base == MAP_FAILED) {
      *base = nullptr;
      why = "cannot map /dev/shm" + name + ": " + errno_text();
    }
  }
  close(fd);
  if (create && !why.empty()) shm_unlink(name.c_str());
  return why;
}

int64_t ShmSegment::size(int64_t world, int64_t chunk_bytes) {
  return kHeaderBytes + (world + 2) * chunk_bytes;
}

std::unique_ptr<ShmSegment> ShmSegment::adopt(void* base, int64_t rank, int64_t world,
                                              int64_t chunk_bytes,
                                              std::chrono::milliseconds timeout) {
  return std::make_unique<Segment>(base, size(world, chunk_bytes), rank, world, chunk_bytes,
                                   timeout);
}

}  // namespace fabric::distributed
