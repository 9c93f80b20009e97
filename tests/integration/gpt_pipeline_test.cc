// examples/gpt under pipeline parallelism (fabric.model_parallel.pipeline_parallel_size) and
// context parallelism (context_parallel_size): every schedule, pp and cp each composed with fsdp
// and with tp, train as ddp does on the same global batch; the whole model is exported from any
// mesh; bad keys are refused before any process starts, one line each.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "tests/checkpoint_diff.h"
#include "tests/integration/gpt_example_fixture.h"

namespace fabric::testing {
namespace {

// 4 blocks so that pp 4 and pp 2 x 2 virtual stages each hold one; SGD (the schedules change the
// order of the micro-batches' sums), clipping that acts (0.1: the tied embedding's gradient
// counted once over the stages; counted on both stages the weights end 0.13 apart) and the
// weights' moving average.
std::string pipeline_args(const std::string& base) {
  return base +
         " model.n_layer=4 optimizer.name=sgd optimizer.lr=0.1 trainer.gradient_clip_val=0.1 "
         "trainer.ema_decay=0.8";
}

// Measured on a 2-vCPU Xeon: every run ends at ddp's validation loss (5.33982) with weights within
// 3.4e-7 relative and averaged weights within 3.7e-7 (the order of the micro-batches' sums).
TEST_F(GptExampleTest, PipelineSchedulesAndMeshesEqualDdp) {
  const Result ddp = run("gpt", pipeline_args(args(2)) + " logging.run_dir=ddp");
  ASSERT_EQ(ddp.code, 0) << ddp.out;
  const std::string pp = " fabric.model_parallel.pipeline_parallel_size=";
  for (const auto& [dir, ranks, extra, mesh] :
       std::vector<std::tuple<std::string, int, std::string, std::string>>{
           {"pp2_1f1b", 2, pp + "2", "pp=2 x dp_shard=1 x tp=1"},
           {"pp2_gpipe", 2, pp + "2 fabric.pipeline.schedule=gpipe fabric.pipeline.micro_batches=8",
            "pp=2 x dp_shard=1 x tp=1"},
           {"pp2_interleaved", 2,
            pp + "2 fabric.pipeline.schedule=interleaved_1f1b fabric.pipeline.virtual_stages=2",
            "pp=2 x dp_shard=1 x tp=1"},
           {"pp4", 4, pp + "4 fabric.pipeline.schedule=gpipe", "pp=4 x dp_shard=1 x tp=1"},
           {"pp2_dp2", 4, pp + "2 fabric.model_parallel.tensor_parallel_size=1 data.batch_size=4",
            "pp=2 x dp_shard=2 x tp=1"},
           {"pp2_tp2", 4, pp + "2 fabric.model_parallel.tensor_parallel_size=2",
            "pp=2 x dp_shard=1 x tp=2"}}) {
    // The global batch stays 8: each data-parallel rank reads 8 / dp of it.
    std::string a = pipeline_args(args(ranks, "model_parallel")) + " data.batch_size=8" + extra +
                    " logging.run_dir=" + dir;
    const Result r = run("gpt", a);
    ASSERT_EQ(r.code, 0) << dir << "\n" << r.out;
    EXPECT_NE(r.out.find("model_parallel: " + mesh), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("checkpoint: none written under pipeline parallelism"), std::string::npos)
        << r.out;
    EXPECT_NEAR(summary_of(r)["val_loss"].get<double>(), summary_of(ddp)["val_loss"].get<double>(),
                1e-6)
        << dir;
    EXPECT_EQ(parity_failure(weights("ddp"), weights(dir), "weights", 1e-6), "") << dir;
    EXPECT_EQ(parity_failure(weights("ddp", "weights_ema.pt"), weights(dir, "weights_ema.pt"),
                             "averaged weights", 1e-6),
              "")
        << dir;
  }
}

// fabric.model_parallel.context_parallel_size 2: each rank runs 2 of the 4 chunks of every
// sequence (ring attention), alone, with fsdp over dp_shard x cp, and with tp; ddp's run, its last
// checkpoint's model and optimizer state too, and a sample after training (whole prompts: cp off).
// Measured: val loss equal to 5 digits, weights within 3.4e-7, averaged weights within 3.7e-7.
TEST_F(GptExampleTest, ContextParallelEqualsDdp) {
  const Result ddp = run("gpt", pipeline_args(args(2)) + " logging.run_dir=ddp");
  ASSERT_EQ(ddp.code, 0) << ddp.out;
  const std::string cp = " fabric.model_parallel.context_parallel_size=2";
  for (const auto& [dir, ranks, extra, mesh] :
       std::vector<std::tuple<std::string, int, std::string, std::string>>{
           {"cp2", 2, cp, "dp_shard=1 x cp=2 x tp=1"},
           {"cp2_dp2", 4, cp + " fabric.model_parallel.tensor_parallel_size=1 data.batch_size=4",
            "dp_shard=2 x cp=2 x tp=1"},
           {"cp2_tp2", 4, cp + " fabric.model_parallel.tensor_parallel_size=2",
            "dp_shard=1 x cp=2 x tp=2"}}) {
    const Result r = run("gpt", pipeline_args(args(ranks, "model_parallel")) +
                                    " data.batch_size=8 gpt.sample_tokens=5" + extra +
                                    " logging.run_dir=" + dir);
    ASSERT_EQ(r.code, 0) << dir << "\n" << r.out;
    EXPECT_NE(r.out.find("model_parallel: " + mesh), std::string::npos) << r.out;
    EXPECT_NEAR(summary_of(r)["val_loss"].get<double>(), summary_of(ddp)["val_loss"].get<double>(),
                1e-6)
        << dir;
    EXPECT_FALSE(summary_of(r)["sample"].get<std::string>().empty()) << dir;
    EXPECT_EQ(parity_failure(weights("ddp"), weights(dir), "weights", 1e-6), "") << dir;
    EXPECT_EQ(parity_failure(weights("ddp", "weights_ema.pt"), weights(dir, "weights_ema.pt"),
                             "averaged weights", 1e-6),
              "")
        << dir;
    EXPECT_EQ(parity_failure(trained_state("ddp"), trained_state(dir), "state", 1e-5), "") << dir;
  }
}

// Each refusal: exit status 2 (a config error) and its one line, before any training.
TEST_F(GptExampleTest, PipelineBadKeysAreRefusedInOneLine) {
  const std::string base = args(2, "model_parallel") + " model.n_layer=4 data.batch_size=8" +
                           " fabric.model_parallel.pipeline_parallel_size=";
  for (const auto& [extra, expected] : std::vector<std::pair<std::string, std::string>>{
           {"3",
            "fabric.model_parallel.pipeline_parallel_size: 4 blocks (model.n_layer) do not "
            "split evenly into 3 pipeline stages; stage counts that divide 4: 1, 2, 4"},
           {"2 model.n_layer=2 fabric.pipeline.schedule=interleaved_1f1b "
            "fabric.pipeline.virtual_stages=2",
            "2 blocks (model.n_layer) do not split evenly into 4 pipeline stages"},
           {"2 fabric.pipeline.micro_batches=1",
            "fabric.pipeline.micro_batches: pipeline: 1F1B needs at least pp micro-batches "
            "(micro_batches=1, pp=2); use micro_batches >= 2 or the gpipe schedule"},
           {"2 data.batch_size=6 fabric.pipeline.micro_batches=4",
            "data.batch_size: a batch of 6 rows does not split into 4 equal micro-batches"},
           {"2 fabric.pipeline.schedule=zero_bubble",
            "fabric.pipeline.schedule: 'zero_bubble' is not an allowed value (one of gpipe, 1f1b, "
            "interleaved_1f1b)"},
           {"2 fabric.pipeline.virtual_stages=2",
            "fabric.pipeline.virtual_stages: 2 needs fabric.pipeline.schedule: interleaved_1f1b"},
           {"2 checkpoint.every_n_steps=2",
            "checkpoint.every_n_steps: checkpoints are not written or read under pipeline "
            "parallelism yet"},
           {"2 trainer.accumulate_grad_batches=2",
            "trainer.accumulate_grad_batches: 2 under pipeline parallelism"},
           {"1 fabric.model_parallel.context_parallel_size=2 model.block_size=30",
            "model.block_size: 30 tokens per sequence do not split into 2 x 2 equal chunks under "
            "context parallelism"},
           {"1 fabric.model_parallel.context_parallel_size=2 model.dropout=0.1",
            "model.dropout: not supported under context parallelism"}}) {
    const Result r = run("gpt", base + extra);
    EXPECT_EQ(r.code, 2) << extra << "\n" << r.out;
    EXPECT_NE(r.last_line().find(expected), std::string::npos) << extra << "\n" << r.out;
    EXPECT_FALSE(std::filesystem::exists(dir_ / "summary.json"));
  }
}

}  // namespace
}  // namespace fabric::testing
