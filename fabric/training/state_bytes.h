// fabric::state_bytes: what a model's training state occupies on this rank, counted from the live
// tensors (each distinct storage once): the parameters (the module's and the optimizer's, which
// alias them under fabric.ddp.shard_optimizer_state), their gradients, and the optimizer's state
// buffers. For comparing strategies' memory (docs/benchmarks.md, zero_test).
#ifndef FABRIC_TRAINING_STATE_BYTES_H_
#define FABRIC_TRAINING_STATE_BYTES_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>

namespace fabric {

struct StateBytes {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;
};

// Throws fabric::Error for an optimizer type fabric/checkpoint/optimizer_state.h does not know.
StateBytes state_bytes(const torch::nn::Module& module, const torch::optim::Optimizer& optimizer);

// The bytes of state `optimizer` will hold once it has stepped, from its options: per parameter
// element (of the tensors it steps, which under fsdp or ZeRO-1 are this rank's pieces) 1 for SGD
// with momentum, 2 for Adam and AdamW (3 with amsgrad), 0 for plain SGD, 2 for any other kind
// (a guess on the safe side), in the parameters' dtype. What data.batch_size: auto reserves
// while it tries batch sizes, and tools/estimate_memory's optimizer column.
int64_t optimizer_state_bytes_expected(const torch::optim::Optimizer& optimizer);

}  // namespace fabric

#endif  // FABRIC_TRAINING_STATE_BYTES_H_
