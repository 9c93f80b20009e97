// Gradient accumulation: one optimizer step over several micro-batches, as Accelerate's
// `accumulate()` and Lightning's `no_backward_sync` + `loss / K` recipe do it.
//
//   int64_t b = loader.state().batches;     // where the pass starts (0, or mid-epoch on resume)
//   for (fabric::Batch& batch : loader) {
//     auto micro = fabric::MicroBatch::in_epoch(b++, loader.size(), k);
//     if (micro.first()) optimizer.zero_grad();
//     f.backward(loss_of(batch), micro);   // loss / count; gradient sync on the last only
//     if (micro.last()) { f.step(optimizer); scheduler.step(); }
//   }
//
// Fabric::backward(loss, micro) divides the loss by `count` and, on every micro-batch but the
// last, skips the gradient synchronization (ddp's all-reduce, fsdp's reduce-scatter: they run once
// per optimizer step). Under 16-mixed every micro-batch's loss is scaled by the same GradScaler
// scale, and Fabric::step unscales, checks and updates once, as in PyTorch's AMP accumulation
// recipe. With equal micro-batches, K micro-batches of B examples give the step one batch of K·B
// gives (tests/integration/accumulation_test.cc: within 1e-6 in fp32, 1 and 2 ranks).
#ifndef FABRIC_TRAINING_ACCUMULATION_H_
#define FABRIC_TRAINING_ACCUMULATION_H_

#include <algorithm>
#include <cstdint>

namespace fabric {

struct MicroBatch {
  int64_t index = 0;  // 0-based position in the optimizer step
  int64_t count = 1;  // micro-batches in this optimizer step

  bool first() const { return index == 0; }
  bool last() const { return index + 1 == count; }

  // Batch `batch` (0-based) of an epoch of `batches`, grouped `k` at a time from the epoch's
  // start; the epoch's last group may be shorter (then its losses are divided by its own count,
  // so the step averages over the examples it saw). REQUIRES: 0 <= batch < batches, k >= 1.
  static MicroBatch in_epoch(int64_t batch, int64_t batches, int64_t k) {
    const int64_t start = batch - batch % k;
    return MicroBatch{batch - start, std::min(k, batches - start)};
  }
  // Optimizer steps in an epoch of `batches` grouped `k` at a time.
  static int64_t steps_in_epoch(int64_t batches, int64_t k) { return (batches + k - 1) / k; }
};

}  // namespace fabric

#endif  // FABRIC_TRAINING_ACCUMULATION_H_
