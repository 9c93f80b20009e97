// Tensor parallelism in real processes (tensor_parallel_helper): the tiny GPT split over a tp
// group trains as one process on the whole batch does, to 1e-5 after 20 SGD-momentum steps (losses,
// parameters, logits), at tp = 2, tp = 4, and tp = 2 x dp = 2 on 4 ranks, with and without sequence
// parallelism; each rank holds 1 / tp
// of the split layers' parameters (counted from the live tensors; a row layer's bias stays whole).
#include <gtest/gtest.h>

#include <string>

#include "tests/run_command.h"

namespace {

double number_after(const std::string& out, const std::string& key) {
  const std::string v = fabric::testing::value_after(out, key);
  return v.empty() ? -1.0 : std::stod(v);
}

void expect_parity(int world, int tp, bool sp = false) {
  const std::string exe =
      fabric::testing::helper_binary("//tests/integration:tensor_parallel_helper");
  const auto r = fabric::testing::run_command(exe + " " + std::to_string(world) + " " +
                                              std::to_string(tp) + " 20" + (sp ? " sp" : ""));
  ASSERT_EQ(r.code, 0) << r.out;
  for (int rank = 0; rank < world; ++rank) {
    const std::string line = fabric::testing::value_after(
        r.out, "rank " + std::to_string(rank) + " of " + std::to_string(world) + ": ");
    ASSERT_FALSE(line.empty()) << "rank " << rank << " did not report:\n" << r.out;
    for (const char* key : {"max_loss_diff=", "max_param_diff=", "max_logit_diff="}) {
      const double d = number_after(line, key);
      EXPECT_GE(d, 0.0) << key << " missing: " << line;
      EXPECT_LE(d, 1e-5) << "world " << world << " tp " << tp << ": " << line;
    }
    // Every split layer's weight is 1 / tp; the row layers' biases (2 x 64 floats per block) stay.
    const double split = number_after(line, "split_bytes="),
                 whole = number_after(line, "whole_bytes=");
    const double row_biases = 3 * 2 * 64 * 4;
    EXPECT_NEAR(split, (whole - row_biases) / tp + row_biases, 1.0) << line;
  }
}

TEST(TensorParallelTest, TwoRanksTrainAsOneProcess) { expect_parity(2, 2); }

TEST(TensorParallelTest, FourRanksTrainAsOneProcess) { expect_parity(4, 4); }

TEST(TensorParallelTest, TwoByTwoMeshTrainsAsOneProcess) { expect_parity(4, 2); }

// Sequence parallelism: norms and residuals on T / tp positions, their weights' gradients summed.
TEST(TensorParallelTest, SequenceParallelTrainsAsOneProcess) {
  expect_parity(2, 2, true);
  expect_parity(4, 2, true);
}

}  // namespace
