// fabric::strategies::FlatGradientSync: averages gradients over the ranks after backward, through
// one persistent flat buffer per gradient dtype and device, with no host work between its kernels
// — so a CUDA graph can capture it, NCCL all-reduce included (fabric/graphed_step.h).
//
// The Reducer (strategies/ddp.h) all-reduces buckets from hooks during backward, overlapping
// communication with compute; its bookkeeping runs on the host between kernels and a replayed
// graph would skip it. This runs after backward instead: copy each gradient into its slot
// (multiplied by 1/world as the Reducer does, or as is for a compression hook), one all-reduce per
// buffer, copy back. The arithmetic is the Reducer's, so the averaged gradients are bitwise the
// same whenever the all-reduce sums elementwise in a fixed order (shared memory, NCCL/Gloo with two
// ranks); tests/integration/ddp_parity_helper.cc checks it on CPU.
//
// The buffers are made at the first run (outside a capture: GraphedStep's warm-up steps) and kept,
// one per parameter dtype and device.
// Every parameter must have a gradient at every run: one without is a fabric::Error naming it
// (a step whose set of gradients changes cannot be replayed).
#ifndef STRATEGIES_FLAT_GRADIENT_SYNC_H_
#define STRATEGIES_FLAT_GRADIENT_SYNC_H_

#include <torch/types.h>

#include <string>
#include <vector>

#include "strategies/ddp_options.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace fabric::strategies {

class FlatGradientSync {
 public:
  // `comm_hook` (fabric.ddp.comm_hook): the wire dtype, pre-divided by the world size as the
  // Reducer's compression hooks do.
  FlatGradientSync(std::vector<torch::Tensor> params, std::vector<std::string> names,
                   c10::intrusive_ptr<c10d::ProcessGroup> pg, CommHook comm_hook);
  ~FlatGradientSync();

  // Replaces every parameter's gradient by its average over the ranks. A collective: every rank
  // calls it at the same point.
  void run();

 private:
  struct Buffer {
    torch::Tensor flat;  // the gradients of `members`, one after another
    torch::Tensor wire;  // comm hooks: `flat` in the wire dtype
    std::vector<size_t> members;
    std::vector<int64_t> offsets;
    std::string description;  // for errors: "gradient all_reduce (Float [N])"
  };
  void build();

  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  torch::ScalarType wire_dtype_ = torch::kFloat;
  bool compress_ = false;
  std::vector<Buffer> buffers_;
};

}  // namespace fabric::strategies

#endif  // STRATEGIES_FLAT_GRADIENT_SYNC_H_
