// The Connector's model_parallel step (fabric/connector_strategy.cc) from replaceable machine
// facts: the mesh's sizes (pp and cp too) by default and as given, sizes that do not fit the
// world refused with the key and the fix, and the model_parallel keys under another strategy said
// to do nothing.
#include <gtest/gtest.h>

#include "fabric/connector.h"
#include "tests/fabric/connector_testing.h"

namespace {

using fabric::StrategyKind;
using namespace fabric::testing;  // NOLINT

TEST(ConnectorModelParallelTest, ModelParallelSizesDefaultToTheNodeAndTheRest) {
  auto s = resolve({"fabric.strategy=model_parallel", "fabric.devices=4"}, cpu_machine());
  EXPECT_EQ(s.strategy, StrategyKind::kModelParallel);
  EXPECT_EQ(s.model_parallel.tensor_parallel_size, 4);  // every process of this one node
  EXPECT_EQ(s.model_parallel.data_parallel_size, 1);
  s = resolve({"fabric.strategy=model_parallel", "fabric.devices=4",
               "fabric.model_parallel.data_parallel_size=2"},
              cpu_machine());
  EXPECT_EQ(s.model_parallel.tensor_parallel_size, 2);
  EXPECT_EQ(s.model_parallel.data_parallel_size, 2);
  EXPECT_EQ(s.model_parallel.replicate_size, 1);
  s = resolve({"fabric.strategy=model_parallel", "fabric.devices=4",
               "fabric.model_parallel.tensor_parallel_size=1",
               "fabric.model_parallel.data_parallel_replicate_size=2"},
              cpu_machine());
  EXPECT_EQ(s.model_parallel.data_parallel_size, 4);  // 2 copies of an fsdp group of 2
  EXPECT_EQ(s.model_parallel.replicate_size, 2);
  s = resolve({"fabric.strategy=model_parallel"}, cpu_machine());  // devices auto: 2 processes
  EXPECT_EQ(s.model_parallel.tensor_parallel_size, 2);
}

// pp and cp divide the world first; tp auto is then the largest count dividing both the node's
// processes and what pp and cp leave; dp the rest. The pipeline keys resolve with them.
TEST(ConnectorModelParallelTest, PipelineAndContextSizesTakeTheirShareFirst) {
  auto s = resolve({"fabric.strategy=model_parallel", "fabric.devices=8",
                    "fabric.model_parallel.pipeline_parallel_size=2"},
                   cpu_machine());
  EXPECT_EQ(s.model_parallel.pipeline_parallel_size, 2);
  EXPECT_EQ(s.model_parallel.tensor_parallel_size, 4);  // gcd(8 on the node, 8 / 2)
  EXPECT_EQ(s.model_parallel.data_parallel_size, 1);
  EXPECT_EQ(s.model_parallel.pipeline_schedule, "1f1b");
  EXPECT_EQ(s.model_parallel.micro_batches, 4);  // 0: 2 x pp x virtual_stages
  s = resolve({"fabric.strategy=model_parallel", "fabric.devices=8",
               "fabric.model_parallel.pipeline_parallel_size=2",
               "fabric.model_parallel.context_parallel_size=2",
               "fabric.model_parallel.tensor_parallel_size=1",
               "fabric.pipeline.schedule=interleaved_1f1b", "fabric.pipeline.virtual_stages=2"},
              cpu_machine());
  EXPECT_EQ(s.model_parallel.context_parallel_size, 2);
  EXPECT_EQ(s.model_parallel.data_parallel_size, 2);  // 8 / (pp 2 x cp 2 x tp 1)
  EXPECT_EQ(s.model_parallel.micro_batches, 8);
  EXPECT_EQ(error_of({"fabric.strategy=model_parallel", "fabric.devices=4",
                      "fabric.model_parallel.pipeline_parallel_size=3"},
                     cpu_machine()),
            "command line: fabric.model_parallel.pipeline_parallel_size: 3 does not divide the "
            "world size 4: give a divisor of it (each stage is world size / this ranks)");
  EXPECT_EQ(error_of({"fabric.strategy=model_parallel", "fabric.devices=4",
                      "fabric.model_parallel.pipeline_parallel_size=2",
                      "fabric.model_parallel.context_parallel_size=4"},
                     cpu_machine()),
            "command line: fabric.model_parallel.context_parallel_size: 4 does not divide world "
            "size / pipeline_parallel_size = 2: give a divisor of it");
  EXPECT_EQ(error_of({"fabric.strategy=model_parallel", "fabric.devices=4",
                      "fabric.model_parallel.pipeline_parallel_size=2",
                      "fabric.model_parallel.tensor_parallel_size=2",
                      "fabric.model_parallel.data_parallel_size=2"},
                     cpu_machine()),
            "command line: fabric.model_parallel.data_parallel_size: 2 x tensor_parallel_size 2 "
            "is not world size / (pipeline_parallel_size x context_parallel_size) = 2: make the "
            "product that, or set it to auto");
}

TEST(ConnectorModelParallelTest, SizesThatDoNotFitTheWorldNameTheKeyAndTheFix) {
  EXPECT_EQ(error_of({"fabric.strategy=model_parallel", "fabric.devices=4",
                      "fabric.model_parallel.tensor_parallel_size=3"},
                     cpu_machine()),
            "command line: fabric.model_parallel.tensor_parallel_size: 3 does not divide the world "
            "size 4: give a divisor of it (tensor-parallel partners are consecutive ranks)");
  EXPECT_EQ(error_of({"fabric.strategy=model_parallel", "fabric.devices=4",
                      "fabric.model_parallel.tensor_parallel_size=2",
                      "fabric.model_parallel.data_parallel_size=4"},
                     cpu_machine()),
            "command line: fabric.model_parallel.data_parallel_size: 4 x tensor_parallel_size 2 "
            "is not the world size 4: make the product the world size, or set it to auto");
  EXPECT_EQ(error_of({"fabric.strategy=model_parallel", "fabric.devices=4",
                      "fabric.model_parallel.data_parallel_size=3"},
                     cpu_machine()),
            "command line: fabric.model_parallel.data_parallel_size: 3 does not divide the world "
            "size 4: give a divisor of it, or set it to auto");
  EXPECT_EQ(error_of({"fabric.strategy=model_parallel", "fabric.devices=4",
                      "fabric.model_parallel.tensor_parallel_size=2",
                      "fabric.model_parallel.data_parallel_replicate_size=4"},
                     cpu_machine()),
            "command line: fabric.model_parallel.data_parallel_replicate_size: 4 does not divide "
            "data_parallel_size 2: give a divisor of it (each copy is an fsdp group of "
            "data_parallel_size / this ranks)");
  EXPECT_EQ(error_of({"fabric.strategy=model_parallel", "fabric.fsdp.sharding_strategy=no_shard"},
                     cpu_machine()),
            "command line: fabric.fsdp.sharding_strategy: no_shard is not supported under "
            "fabric.strategy: model_parallel (its data-parallel ranks are fsdp's); use full_shard "
            "or shard_grad_op");
}

// DDP's gradient and ZeRO-1 keys do nothing under fsdp and model_parallel (their process group
// settings do apply); under fsdp no_shard, which is ddp, they apply.
TEST(ConnectorModelParallelTest, DdpsGradientKeysUnderShardingStrategiesAreSaidToHaveNoEffect) {
  for (const std::string want : {"fsdp", "model_parallel"}) {
    const auto s = resolve({"fabric.strategy=" + want, "fabric.ddp.shard_optimizer_state=true",
                            "fabric.ddp.comm_hook=fp16", "fabric.ddp.timeout_s=60"},
                           cpu_machine());
    ASSERT_EQ(s.warnings.size(), 1u) << want;
    EXPECT_EQ(s.warnings[0],
              "command line: fabric.ddp.comm_hook, fabric.ddp.shard_optimizer_state: have no "
              "effect under fabric.strategy: " +
                  want + " (fabric.ddp's gradient and ZeRO-1 keys configure ddp; " + want +
                  " shards gradients and optimizer state itself)");
  }
  EXPECT_TRUE(resolve({"fabric.strategy=fsdp", "fabric.fsdp.sharding_strategy=no_shard",
                       "fabric.ddp.comm_hook=fp16"},
                      cpu_machine())
                  .warnings.empty());
}

TEST(ConnectorModelParallelTest, ItsKeysUnderAnotherStrategyAreSaidToHaveNoEffect) {
  const auto s = resolve({"fabric.strategy=ddp", "fabric.model_parallel.tensor_parallel_size=2"},
                         cpu_machine());
  EXPECT_EQ(s.strategy, StrategyKind::kDdp);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_EQ(s.warnings[0],
            "command line: fabric.model_parallel.tensor_parallel_size: has no effect under "
            "fabric.strategy: ddp (it configures model_parallel)");
}

}  // namespace

namespace {

// At pipeline_parallel_size 1 the pipeline keys have no effect: a warning each, never an error
// for values only a pipeline checks (virtual_stages without interleaved_1f1b).
TEST(ConnectorModelParallelTest, PipelineKeysAtOneStageAreSaidToHaveNoEffect) {
  const auto s =
      resolve({"fabric.strategy=model_parallel", "fabric.devices=2",
               "fabric.model_parallel.tensor_parallel_size=1", "fabric.pipeline.virtual_stages=2"},
              cpu_machine());
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_EQ(s.warnings[0],
            "command line: fabric.pipeline.virtual_stages: has no effect at "
            "fabric.model_parallel.pipeline_parallel_size 1");
}

}  // namespace
