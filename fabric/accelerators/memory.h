// Tensor memory per process: how much a device holds, the most since a reset, and a cap.
//
// CPU: LibTorch's CPU allocator, wrapped by a counting one the first time a limit is set or the
// statistics are asked for (tensors made before that are not counted; the wrapper stays for the
// life of the process). Only tensor storage counts: not the program, its libraries, oneDNN's
// scratch memory or the allocator's own free lists. Over the limit, an allocation throws
// c10::OutOfMemoryError, as the CUDA caching allocator does, so one catch handles both.
// CUDA: the caching allocator's own statistics, and its per-process memory fraction as the
// limit (set_memory_limit divides by the device's total memory).
#ifndef FABRIC_ACCELERATORS_MEMORY_H_
#define FABRIC_ACCELERATORS_MEMORY_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace fabric {

struct MemoryStats {
  int64_t allocated = 0;  // bytes of tensors alive now
  int64_t peak = 0;       // the most at any time since the last reset_peak_memory
  int64_t limit = 0;      // 0: none
};

MemoryStats memory_stats(c10::Device device);
// Whether memory_stats(device) counts every tensor the process made since it started using the
// device: CUDA always; the CPU once a limit was set or the statistics asked for (the counting
// allocator installed), which fabric.tensor_memory_limit_gb does at launch.
bool memory_counted(c10::Device device);
void reset_peak_memory(c10::Device device);
// Caps this process's tensor memory on `device` (bytes; 0 lifts the cap).
void set_memory_limit(c10::Device device, int64_t bytes);

// Frees what the device's allocator keeps cached for reuse (CUDA: emptyCache; CPU: nothing),
// after an out-of-memory error and before a retry.
void release_cached_memory(c10::Device device);

// The host memory available to new allocations now (Linux: MemAvailable of /proc/meminfo);
// 0 when unknown.
int64_t available_host_memory();

// True for the error an allocation over a limit (or over a GPU's memory) throws.
bool is_out_of_memory(const std::exception& e);

// "512MiB", "2GiB", "1.5GB", "300MB", "1048576" (bytes; K/M/G/T are powers of 1000 when the
// suffix ends in B without i, of 1024 with i). Throws std::invalid_argument saying what it takes.
int64_t parse_bytes(const std::string& text);
// 1.50 GiB, 12.0 MiB, 512 B.
std::string format_bytes(int64_t bytes);

}  // namespace fabric

#endif  // FABRIC_ACCELERATORS_MEMORY_H_
