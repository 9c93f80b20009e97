// fabric::FlopCounter: the floating-point operations a piece of training code executes, counted
// from the operators it dispatches (as torch.utils.flop_counter and Lightning's measure_flops do),
// for throughput in TFLOP/s and MFU.
//
// While a FlopCounter lives, a thread-local RecordFunction callback sees every ATen operator the
// constructing thread runs (and the autograd threads running its backward, which inherit the
// callback) and adds the multiply-adds of the dense ones, two FLOPs each:
//   aten::mm, addmm, bmm, baddbmm             2·m·k·n (per batch)
//   aten::convolution                          2 · output elements · Cin/groups · kernel size
//   aten::convolution_backward                 the forward's count per gradient asked (input,
//                                              weight)
//   aten::scaled_dot_product_attention         2·L·S·(E + Ev) per batch and head (causal or not)
//   its fused backward kernels                 twice the forward's
// Operators inside a counted one (the GEMMs of a decomposed attention, ...) are not counted again.
// Elementwise operators, normalization and the optimizer count nothing; with activation
// checkpointing the recomputed forward counts (the count is what ran, not the model's minimum).
//
//   fabric::FlopCounter counter;
//   loss = model->forward(x) ...; loss.backward();
//   double flops = counter.total();          // forward + backward of one step
//
// One counter at a time per process (a second throws fabric::Error); cheap enough for one step,
// not meant to stay on (every operator's inputs are recorded).
#ifndef FABRIC_TRAINING_FLOP_COUNTER_H_
#define FABRIC_TRAINING_FLOP_COUNTER_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace fabric {

class FlopCounter {
 public:
  FlopCounter();
  ~FlopCounter();
  FlopCounter(const FlopCounter&) = delete;
  FlopCounter& operator=(const FlopCounter&) = delete;

  // FLOPs counted so far, in all and by operator name ("aten::mm", ...).
  double total() const;
  std::map<std::string, double> by_operator() const;

  // Called by the callback (public for it; not for users).
  void add(const std::string& op, double flops);

 private:
  mutable std::mutex mutex_;
  std::map<std::string, double> by_operator_;
  double total_ = 0;
  uint64_t handle_ = 0;
};

}  // namespace fabric

#endif  // FABRIC_TRAINING_FLOP_COUNTER_H_
