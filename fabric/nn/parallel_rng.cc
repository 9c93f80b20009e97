#include "fabric/nn/parallel_rng.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include "fabric/core/error.h"

#ifdef FABRIC_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#endif

namespace fabric::nn {

namespace {

// SplitMix64's finalizer: nearby inputs (ranks 0, 1, ...) to unrelated seeds.
uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

RankRandomScope::RankRandomScope(const c10::Device& device, int64_t rank) {
  const auto salt = static_cast<uint64_t>(rank + 1) * 0xD1B54A32D192ED03ULL;
  if (device.is_cpu()) {
    generator_ = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator_.mutex());
    const uint64_t next = generator_.get<at::CPUGeneratorImpl>()->random64();  // advances it
    resume_ = generator_.get_state();
    generator_.set_current_seed(mix(next ^ salt));
    return;
  }
#ifdef FABRIC_WITH_CUDA
  if (device.is_cuda()) {
    if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None)
      throw Error(
          "dropout under tensor parallelism draws each rank's masks from a stream of its own, "
          "which a CUDA graph cannot capture: set fabric.cuda_graphs: false or model.dropout: 0");
    generator_ = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    std::lock_guard<std::mutex> lock(generator_.mutex());
    auto* cuda = generator_.get<at::CUDAGeneratorImpl>();
    // Philox: the stream is (seed, offset); its next position names it, and moves on by 4 (one
    // draw's worth).
    const uint64_t offset = cuda->get_offset();
    const uint64_t next = mix(cuda->current_seed() ^ mix(offset));
    cuda->set_offset(offset + 4);
    resume_ = generator_.get_state();
    generator_.set_current_seed(mix(next ^ salt));
    return;
  }
#endif
  throw Error("tensor-parallel dropout: no default generator for device " + device.str());
}

RankRandomScope::~RankRandomScope() {
  std::lock_guard<std::mutex> lock(generator_.mutex());
  generator_.set_state(resume_);
}

}  // namespace fabric::nn
