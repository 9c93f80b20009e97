// Random numbers for the parts of a tensor that tensor-parallel ranks hold different pieces of.
//
// Every rank of a job starts from fabric.seed, so the ranks of a tp group draw the same dropout
// masks: right where each holds the whole activation (it must stay equal on all of them), wrong
// where each holds a different piece (its attention heads; its positions under sequence
// parallelism), where every piece would get the same mask pattern and the heads or chunks be
// dropped in lockstep. A RankRandomScope makes the default generator of a device draw, inside
// it, from a stream of this rank's own (Megatron-LM forks its tensor-parallel RNG the same way):
//   - its seed comes from the default generator's next number and the rank, so the streams
//     differ between ranks and between scopes, and the default generator advances by that one
//     number on every rank (it stays in step across the group);
//   - it is a function of the default generator's state at entry, so activation checkpointing,
//     which restores that state before recomputing, redraws the same masks.
// Not inside a CUDA graph capture (a generator's state cannot be swapped there): fabric::Error.
#ifndef FABRIC_NN_PARALLEL_RNG_H_
#define FABRIC_NN_PARALLEL_RNG_H_

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace fabric::nn {

class RankRandomScope {
 public:
  // rank: this rank's place in the group whose pieces must differ (its tp rank).
  RankRandomScope(const c10::Device& device, int64_t rank);
  ~RankRandomScope();
  RankRandomScope(const RankRandomScope&) = delete;
  RankRandomScope& operator=(const RankRandomScope&) = delete;

 private:
  at::Generator generator_;
  at::Tensor resume_;  // the default generator's state to go on from at exit
};

}  // namespace fabric::nn

#endif  // FABRIC_NN_PARALLEL_RNG_H_
