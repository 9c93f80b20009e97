// Parameter groups (optimizer.no_weight_decay, optimizer.lr_scale) with real processes: training
// with make_optimizer's groups and a scheduled rate equals, within 1e-6, one plain-LibTorch process
// whose groups are written out by hand, on a single device, under ddp, under ddp with the optimizer
// state sharded (ZeRO) and under fsdp (2 ranks each), for SGD with momentum and for AdamW; the
// same training with one plain group is measurably different (so the rules took effect).
// Plateau scheduling and exact resume with groups: training_features_test.
#include <gtest/gtest.h>

#include <string>

#include "tests/run_command.h"

namespace {

using fabric::testing::helper_binary;
using fabric::testing::run_command;

void expect_parity(const std::string& args) {
  const std::string cmd = helper_binary("//tests/integration:param_groups_helper") +
                          " fabric.accelerator=cpu optimizer.weight_decay=0.1"
                          " 'optimizer.no_weight_decay=[\"*.bias\", \"type:LayerNorm\"]'"
                          " 'optimizer.lr_scale=[\"3.*=5\"]' scheduler.name=cosine"
                          " scheduler.warmup_steps=2 " +
                          args;
  const auto r = run_command(cmd);
  EXPECT_EQ(r.code, 0) << args << "\n" << r.out;
  EXPECT_NE(r.out.find("groups=4 max_rel_diff="), std::string::npos) << args << "\n" << r.out;
}

const char* const kSgd = " optimizer.name=sgd optimizer.lr=0.05";
const char* const kAdamW = " optimizer.name=adamw optimizer.lr=0.01";

TEST(ParamGroupsTest, SingleDeviceMatchesHandWrittenGroups) {
  expect_parity(std::string("fabric.strategy=single_device") + kSgd);
  expect_parity(std::string("fabric.strategy=single_device") + kAdamW);
}

TEST(ParamGroupsTest, DdpMatchesHandWrittenGroups) {
  expect_parity(std::string("fabric.strategy=ddp fabric.devices=2") + kAdamW);
}

TEST(ParamGroupsTest, ShardedOptimizerStateMatchesHandWrittenGroups) {
  expect_parity(std::string("fabric.strategy=ddp fabric.devices=2 "
                            "fabric.ddp.shard_optimizer_state=true") +
                kAdamW);
}

TEST(ParamGroupsTest, FsdpMatchesHandWrittenGroups) {
  expect_parity(
      std::string("fabric.strategy=fsdp fabric.devices=2 fabric.fsdp.min_unit_params=50") + kSgd);
}

}  // namespace
