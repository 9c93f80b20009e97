// The Connector's precision step (fabric/connector_precision.cc) from replaceable machine
// facts: precisions a device cannot run are refused with the reason and the fix, and the fp8 keys
// reach the precision plugin or say they have no effect. (The CPU's fallbacks and emulated bf16:
// connector_cpu_test.)
#include <gtest/gtest.h>

#include <algorithm>

#include "fabric/connector.h"
#include "tests/fabric/connector_testing.h"

namespace {

using fabric::MachineFacts;
using namespace fabric::testing;  // NOLINT

TEST(ConnectorTest, PrecisionsTheDeviceCannotRunSayWhyAndWhatToDo) {
  EXPECT_EQ(
      error_of({"fabric.precision=16-true"}, cpu_machine()),
      "command line: fabric.precision: '16-true' is not supported on CPU (float16 CPU kernels "
      "are slow and incomplete): use bf16-true or bf16-mixed, or run on cuda");
  EXPECT_EQ(error_of({"fabric.precision=bf16"}, gpu_machine(1, /*bf16=*/false)),
            "command line: fabric.precision: 'bf16-mixed' needs a GPU with bfloat16 support "
            "(compute capability >= 8.0): use 16-mixed");
  // gpu_machine's devices are bf16-capable, not fp8-capable (cuda_fp8_supported false).
  EXPECT_EQ(error_of({"fabric.precision=fp8"}, gpu_machine(1)),
            "command line: fabric.precision: 'fp8-mixed' needs GPUs of compute capability >= 8.9 "
            "(Ada, Hopper or newer) for float8 GEMMs: use bf16-mixed");
  EXPECT_EQ(error_of({"fabric.precision=fp8", "fabric.fp8.recipe=rowwise"}, cpu_machine()),
            "command line: fabric.fp8.recipe: 'rowwise' runs on CUDA GPUs only (LibTorch's CPU "
            "_scaled_mm takes one scale per tensor): use tensorwise on a CPU");
  MachineFacts ada = gpu_machine(1);  // compute capability 8.9: float8, tensorwise only
  ada.cuda_fp8_supported = true;
  EXPECT_EQ(error_of({"fabric.precision=fp8", "fabric.fp8.recipe=rowwise"}, ada),
            "command line: fabric.fp8.recipe: 'rowwise' needs GPUs of compute capability >= 9.0 "
            "(Hopper or newer): use tensorwise");
}

TEST(ConnectorTest, Fp8RowwiseReachesThePrecisionOnHopperAndWarnsElsewhere) {
  MachineFacts hopper = gpu_machine(1);
  hopper.cuda_fp8_supported = hopper.cuda_fp8_rowwise_supported = true;
  auto s = resolve({"fabric.precision=fp8", "fabric.fp8.recipe=rowwise"}, hopper);
  EXPECT_TRUE(s.fp8_rowwise);
  EXPECT_TRUE(build_strategy(s)->precision().fp8_rowwise());
  EXPECT_FALSE(resolve({"fabric.precision=fp8"}, hopper).fp8_rowwise);
  s = resolve({"fabric.precision=bf16-mixed", "fabric.fp8.recipe=rowwise"}, hopper);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_EQ(s.warnings[0],
            "command line: fabric.fp8.recipe: has no effect under fabric.precision: bf16-mixed (it "
            "configures fp8-mixed)");
}

TEST(ConnectorTest, Fp8DelayedCarriesItsHistoryLengthAndItsKeyWarnsElsewhere) {
  auto s =
      resolve({"fabric.precision=fp8", "fabric.fp8.recipe=delayed", "fabric.fp8.amax_history=4"},
              cpu_machine());
  EXPECT_EQ(s.fp8_amax_history, 4);
  EXPECT_FALSE(s.fp8_rowwise);
  EXPECT_EQ(build_strategy(s)->precision().fp8_amax_history(), 4);
  EXPECT_EQ(resolve({"fabric.precision=fp8", "fabric.fp8.recipe=delayed"}, cpu_machine())
                .fp8_amax_history,
            16);
  EXPECT_EQ(resolve({"fabric.precision=fp8"}, cpu_machine()).fp8_amax_history, 0);
  s = resolve({"fabric.precision=fp8", "fabric.fp8.amax_history=4"}, cpu_machine());
  EXPECT_EQ(s.fp8_amax_history, 0);
  // (Beside the CPU's warnings about fp8-mixed's speed here.)
  EXPECT_EQ(std::count(s.warnings.begin(), s.warnings.end(),
                       "command line: fabric.fp8.amax_history: has no effect under "
                       "fabric.fp8.recipe: tensorwise (it configures delayed scaling)"),
            1);
  EXPECT_EQ(
      resolve({"fabric.precision=fp8", "fabric.fp8.recipe=delayed"}, cpu_machine()).warnings.size(),
      resolve({"fabric.precision=fp8"}, cpu_machine()).warnings.size());
  EXPECT_EQ(
      error_of({"fabric.precision=fp8", "fabric.fp8.recipe=delayed", "fabric.fp8.amax_history=0"},
               cpu_machine()),
      "command line: fabric.fp8.amax_history: 0 is out of range: must be >= 1");
}

TEST(ConnectorTest, Fp8GradMarginIsThreeByDefaultCarriedAndItsKeyWarnsElsewhere) {
  EXPECT_EQ(
      resolve({"fabric.precision=fp8", "fabric.fp8.recipe=delayed"}, cpu_machine()).fp8_grad_margin,
      3);
  auto s =
      resolve({"fabric.precision=fp8", "fabric.fp8.recipe=delayed", "fabric.fp8.grad_margin=0"},
              cpu_machine());
  EXPECT_EQ(s.fp8_grad_margin, 0);
  EXPECT_EQ(build_strategy(s)->precision().fp8_grad_margin(), 0);
  s = resolve({"fabric.precision=fp8", "fabric.fp8.grad_margin=2"}, cpu_machine());
  EXPECT_EQ(std::count(s.warnings.begin(), s.warnings.end(),
                       "command line: fabric.fp8.grad_margin: has no effect under "
                       "fabric.fp8.recipe: tensorwise (it configures delayed scaling)"),
            1);
  EXPECT_EQ(
      error_of({"fabric.precision=fp8", "fabric.fp8.recipe=delayed", "fabric.fp8.grad_margin=16"},
               cpu_machine()),
      "command line: fabric.fp8.grad_margin: 16 is out of range: must be >= 0 and <= 15");
}

TEST(ConnectorTest, Fp8FastAccumulationIsOnByDefaultAndItsKeyWarnsElsewhere) {
  EXPECT_TRUE(resolve({"fabric.precision=fp8"}, cpu_machine()).fp8_fast_accumulation);
  auto s = resolve({"fabric.precision=fp8", "fabric.fp8.fast_accumulation=false"}, cpu_machine());
  EXPECT_FALSE(s.fp8_fast_accumulation);
  EXPECT_FALSE(build_strategy(s)->precision().fp8_fast_accumulation());
  s = resolve({"fabric.precision=bf16-mixed", "fabric.fp8.fast_accumulation=false"}, cpu_machine());
  EXPECT_EQ(std::count(s.warnings.begin(), s.warnings.end(),
                       "command line: fabric.fp8.fast_accumulation: has no effect under "
                       "fabric.precision: bf16-mixed (it configures fp8-mixed)"),
            1);
}

}  // namespace
