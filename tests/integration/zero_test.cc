// ZeRO stage 1 (fabric.ddp.shard_optimizer_state, strategies/optimizer_shard.h) against plain
// DDP with real processes (tests/integration/resume_helper.cc: a conv net with BatchNorm and
// Dropout, 16 steps, the shared-memory backend):
//   - parity: the trained parameters and the whole optimizer state (saved in one process's layout)
//     equal DDP's within 1e-6 relative, at 2 and 3 ranks (width 6: 1,259 elements, divisible by
//     neither, and parameters straddle the ranks' parts), with SGD-momentum and AdamW, plain and
//     with gradient clipping + 2 micro-batches through no_backward_sync;
//   - memory: per rank, optimizer state and gradients counted from the live tensors are 1/N of
//     DDP's (plus padding), parameters the same;
//   - checkpoints: bitwise continuation at the same world size; a checkpoint written by 2 ranks
//     loads at 3 ranks and at 1 (its state re-saved there is bitwise the same), and training
//     continues under plain DDP to DDP's result.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <regex>
#include <string>

#include "tests/checkpoint_diff.h"
#include "tests/integration/resume_helper_job.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

// Parity with ddp (docs/training.md, "Bitwise parity"). Without gradient clipping the sharded
// run is bitwise ddp's: every element is updated by the same arithmetic (the Reducer's ×1/N
// before the sum; each rank's piece of a parameter cut where ddp's kernels cut it, flat_layout
// in strategies/optimizer_shard.h; the 2- and 3-rank sums of the shared-memory all-reduce and of
// Gloo's reduce-scatter associate alike), on any SIMD width (AVX2-held twins of these tests).
// With clipping one reduction differs in order: the gradient norm, summed per piece instead of
// per parameter. That rounds by a few float32 ulps (2^-23 = 1.2e-7 relative) and scales every
// gradient by it, in each of the ≤16 steps: kClipBound = 16 ulps (measured up to 3.0e-7).
constexpr double kClipBound = 16 * 1.1920929e-7;

class ZeroTest : public fabric::testing::ResumeHelperJob {
 protected:
  ZeroTest() : ResumeHelperJob("fabric.strategy=ddp") {}
};

TEST_F(ZeroTest, TrainsLikeDdpWithEveryOptimizerAndVariant) {
  for (const char* world : {"2", "3"}) {
    for (const char* optimizer : {"sgd", "adamw"}) {
      for (const char* variant : {"", "test.clip_norm=0.05 test.accumulate=2"}) {
        const std::string job = std::string("fabric.devices=") + world + " test.width=6" +
                                " optimizer.name=" + optimizer + " " + variant + " ";
        SCOPED_TRACE(job);
        auto ddp = run(job + "test.out=ddp.ckpt");
        ASSERT_EQ(ddp.code, 0) << ddp.out;
        auto zero = run(job + "fabric.ddp.shard_optimizer_state=true test.out=zero.ckpt");
        ASSERT_EQ(zero.code, 0) << zero.out;
        for (const char* name : {"model", "optimizer"}) {
          const double bound = *variant == '\0' ? 0 : kClipBound;  // 0: bitwise
          EXPECT_EQ(fabric::testing::parity_failure(entry("ddp.ckpt", name),
                                                    entry("zero.ckpt", name), name, bound),
                    "");
        }
      }
    }
  }
  // The variants change the result (clipping is active at 0.05), so the comparison can fail.
  auto plain = run("fabric.devices=2 optimizer.name=sgd test.out=plain.ckpt");
  auto clipped = run("fabric.devices=2 optimizer.name=sgd test.clip_norm=0.05 test.out=clip.ckpt");
  ASSERT_EQ(plain.code, 0) << plain.out;
  ASSERT_EQ(clipped.code, 0) << clipped.out;
  EXPECT_GT(fabric::testing::max_relative_difference(entry("plain.ckpt", "model"),
                                                     entry("clip.ckpt", "model")),
            1e-3);
}

// "rank R bytes parameters=P gradients=G optimizer=O" of every rank, summed per field; and the
// largest per-rank value of each field.
struct Bytes {
  int64_t ranks = 0, parameters = 0, gradients = 0, optimizer = 0, max_optimizer = 0;
};
Bytes bytes(const std::string& out) {
  Bytes b;
  const std::regex line(R"(rank \d+ bytes parameters=(\d+) gradients=(\d+) optimizer=(\d+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    ++b.ranks;
    b.parameters = std::stoll((*it)[1]);  // the same on every rank
    b.gradients = std::max(b.gradients, static_cast<int64_t>(std::stoll((*it)[2])));
    b.optimizer += std::stoll((*it)[3]);
    b.max_optimizer = std::max(b.max_optimizer, static_cast<int64_t>(std::stoll((*it)[3])));
  }
  return b;
}

TEST_F(ZeroTest, OptimizerStateAndGradientsTakeOneNthPerRank) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(std::to_string(world) + " ranks");
    const std::string job =
        "fabric.devices=" + std::to_string(world) + " optimizer.name=adamw test.memory=true ";
    auto ddp = run(job);
    auto zero = run(job + "fabric.ddp.shard_optimizer_state=true");
    ASSERT_EQ(ddp.code, 0) << ddp.out;
    ASSERT_EQ(zero.code, 0) << zero.out;
    const Bytes d = bytes(ddp.out), z = bytes(zero.out);
    ASSERT_EQ(d.ranks, world) << ddp.out;
    ASSERT_EQ(z.ranks, world) << zero.out;
    EXPECT_EQ(z.parameters, d.parameters);
    const int64_t per_rank_optimizer = d.optimizer / world;  // DDP: every rank holds it all
    // The flat layout (strategies/optimizer_shard.h, flat_layout) starts each of the model's 6
    // parameters and each rank's part at a multiple of 128 bytes: a rank's part is at most
    // 127 bytes over its 1/N plus 127 per parameter, for each of AdamW's two float buffers.
    const int64_t layout = 128 * (6 + 1);
    EXPECT_LE(z.max_optimizer, per_rank_optimizer / world + 2 * layout);
    EXPECT_LE(z.optimizer, per_rank_optimizer + 2 * 4 * world);  // the pieces: no gaps
    EXPECT_LE(z.gradients, d.gradients / world + layout);
  }
}

TEST_F(ZeroTest, SameWorldSizeResumeIsBitwiseExact) {
  const std::string job =
      "fabric.devices=2 optimizer.name=adamw fabric.ddp.shard_optimizer_state=true ";
  auto full = run(job + "test.out=full.ckpt");
  ASSERT_EQ(full.code, 0) << full.out;
  auto first = run(job + "checkpoint.every_n_steps=7 test.stop_at_step=7 checkpoint.dir=first");
  ASSERT_EQ(first.code, 0) << first.out;
  auto second = run(job +
                    "checkpoint.resume=first/step-00000007.ckpt checkpoint.dir=second "
                    "test.out=resumed.ckpt");
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_NE(second.out.find("resumed from"), std::string::npos) << second.out;
  EXPECT_EQ(fabric::testing::compare_checkpoints(dir_ / "full.ckpt", dir_ / "resumed.ckpt"), "");
}

TEST_F(ZeroTest, CheckpointsLoadAtOtherWorldSizesAndUnderPlainDdp) {
  // Step 8 of 2 ranks (batch 6, 20 examples each) ends an epoch: the loader's position loads at
  // any world size.
  const std::string common = "optimizer.name=adamw ";
  const std::string zero = "fabric.ddp.shard_optimizer_state=true ";
  auto saved = run(common + zero +
                   "fabric.devices=2 checkpoint.every_n_steps=8 "
                   "test.stop_at_step=8 checkpoint.dir=two");
  ASSERT_EQ(saved.code, 0) << saved.out;
  const std::string ckpt = "two/step-00000008.ckpt";
  // Loaded by 3 sharded ranks, then by one process, and saved again at once (trainer.max_steps=8:
  // nothing to train): the same parameters and optimizer state (the learning rate differs: the
  // schedule's length changed).
  auto same_state = [&](const std::string& file) {
    EXPECT_EQ(
        fabric::testing::first_difference(entry(ckpt, "model"), entry(file, "model"), "model"), "")
        << file;
    EXPECT_EQ(fabric::testing::first_difference(
                  entry(ckpt, "optimizer").toGenericDict().at("state"),
                  entry(file, "optimizer").toGenericDict().at("state"), "optimizer/state"),
              "")
        << file;
  };
  auto three =
      run(common + zero + "fabric.devices=3 trainer.max_steps=8 checkpoint.resume=" + ckpt +
          " checkpoint.dir=three");
  ASSERT_EQ(three.code, 0) << three.out;
  same_state("three/step-00000008.ckpt");
  auto one = run(common +
                 "fabric.devices=1 trainer.max_steps=8 "
                 "checkpoint.resume=three/step-00000008.ckpt checkpoint.dir=one");
  ASSERT_EQ(one.code, 0) << one.out;
  same_state("one/step-00000008.ckpt");
  // Training goes on from the sharded checkpoint under plain DDP as if DDP had run throughout.
  auto ddp = run(common + "fabric.devices=2 test.out=ddp.ckpt");
  ASSERT_EQ(ddp.code, 0) << ddp.out;
  auto continued = run(common + "fabric.devices=2 checkpoint.resume=" + ckpt +
                       " checkpoint.dir=continued test.out=continued.ckpt");
  ASSERT_EQ(continued.code, 0) << continued.out;
  EXPECT_EQ(fabric::testing::first_difference(state("ddp.ckpt"), state("continued.ckpt"), "state"),
            "");
  // And the sharded job at 3 ranks trains on from it.
  auto onward =
      run(common + zero + "fabric.devices=3 checkpoint.dir=onward checkpoint.resume=" + ckpt);
  EXPECT_EQ(onward.code, 0) << onward.out;
  EXPECT_NE(onward.out.find("done at step 16"), std::string::npos) << onward.out;
}

// What sharding cannot do is refused at setup with the key to change.
TEST_F(ZeroTest, UnsupportedCombinationsNameTheKey) {
  auto r = run("fabric.devices=2 fabric.ddp.shard_optimizer_state=true fabric.ddp.comm_hook=bf16");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("error: fabric.ddp.shard_optimizer_state: comm_hook bf16 is not supported "
                       "with it; set fabric.ddp.comm_hook: none"),
            std::string::npos)
      << r.out;
}

}  // namespace
