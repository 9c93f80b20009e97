// Gradient accumulation (fabric/training/accumulation.h) with real processes: K micro-batches of
// B examples per rank give the optimizer step that one batch of K·B gives (fp32, within 1e-6 of a
// single plain-LibTorch process on the whole global batch), on a single device, under ddp (2
// ranks) and fsdp (2 ranks), through Fabric::backward(loss, MicroBatch) and through GraphedStep;
// gradients are synchronized once per optimizer step, not once per micro-batch; a shorter group
// (an epoch's last) averages over what it saw; a micro-batch index outside [0, count) is an error.
// The examples' loop with trainer.accumulate_grad_batches resumes bitwise (training_features_test).
#include <gtest/gtest.h>

#include <string>

#include "tests/run_command.h"

namespace {

using fabric::testing::helper_binary;
using fabric::testing::run_command;

std::string job(const std::string& args) {
  return helper_binary("//tests/integration:accumulation_helper") +
         " fabric.accelerator=cpu optimizer.implementation=for_loop " + args;
}

void expect_parity(const std::string& args) {
  const auto r = run_command(job(args));
  EXPECT_EQ(r.code, 0) << args << "\n" << r.out;
  EXPECT_NE(r.out.find("max_rel_diff="), std::string::npos) << args << "\n" << r.out;
}

TEST(AccumulationTest, SingleDeviceMatchesOneBigBatch) {
  expect_parity("fabric.strategy=single_device test.k=4");
  expect_parity("fabric.strategy=single_device test.k=3 test.mode=graphed");
}

TEST(AccumulationTest, DdpMatchesOneBigBatchAndSyncsOncePerStep) {
  expect_parity("fabric.strategy=ddp fabric.devices=2 test.k=4");
  expect_parity("fabric.strategy=ddp fabric.devices=2 test.k=3 test.mode=graphed");
}

TEST(AccumulationTest, FsdpMatchesOneBigBatchAndSyncsOncePerStep) {
  expect_parity("fabric.strategy=fsdp fabric.devices=2 test.k=3");
}

TEST(AccumulationTest, AShorterGroupAveragesOverWhatItSaw) {
  expect_parity("fabric.strategy=ddp fabric.devices=2 test.k=3 test.mode=short");
}

TEST(AccumulationTest, AnIndexOutsideTheGroupIsAnError) {
  const auto r = run_command(job("fabric.strategy=single_device test.k=2 test.mode=bad_index"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("error: Fabric::backward: micro-batch 2 of 2 is outside [0, count)"),
            std::string::npos)
      << r.out;
}

}  // namespace
