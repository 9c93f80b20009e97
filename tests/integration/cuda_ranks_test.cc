// GPU: several ranks on one GPU (fabric.ddp.ranks_per_gpu=2, Gloo for the CUDA tensors), started
// as a user starts them: a Fabric job that self-launches (cuda_ranks_helper).
#include <gtest/gtest.h>

#include <iostream>
#include <string>

#include "tests/cuda_skip.h"
#include "tests/run_command.h"

namespace {

fabric::testing::CommandResult helper(const std::string& args) {
  const std::string exe = fabric::testing::helper_binary("//tests/integration:cuda_ranks_helper");
  return fabric::testing::run_command(exe + " " + args);
}

// 16-mixed: an inf in rank 1's gradient at step 3 makes every rank skip that step, under ddp
// (the all-reduce spreads the inf) and under ZeRO-1 (only one rank's shard holds it: the
// GradScaler's found_inf agreement decides).
TEST(CudaRanksTest, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  SKIP_WITHOUT_CUDA();
  for (const std::string extra : {"", "fabric.ddp.shard_optimizer_state=true"}) {
    auto r = helper("overflow " + extra);
    EXPECT_EQ(r.code, 0) << extra << "\n" << r.out;
    EXPECT_NE(r.out.find("rank 1: stepped"), std::string::npos) << r.out;
  }
}

TEST(CudaRanksTest, SyncBatchNormOverTwoRanksEqualsBatchNormOnTheGlobalBatch) {
  SKIP_WITHOUT_CUDA();
  auto r = helper("syncbn");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("max_rel="), std::string::npos) << r.out;
  std::cout << r.out << std::endl;
}

// NCCL refuses two ranks on one GPU; the config says so before anything starts.
TEST(CudaRanksTest, NcclWithRanksSharingAGpuIsAOneLineError) {
  SKIP_WITHOUT_CUDA();
  auto r = helper("overflow fabric.ddp.cuda_backend=nccl");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("fabric.ddp.cuda_backend: nccl cannot run 2 ranks on one GPU"),
            std::string::npos)
      << r.out;
}

}  // namespace
