// Fully sharded data parallel (fabric.strategy: fsdp, strategies/fsdp.h) against plain DDP with
// real processes (tests/integration/resume_helper.cc: a conv net with BatchNorm and Dropout, 16
// steps, the shared-memory backend; width 6: 1,259 parameters, divisible by neither 2 nor 3):
//   - parity: the trained parameters and the whole optimizer state (saved in one process's
//     layout) equal DDP's within 1e-6 relative, at 2 and 3 ranks, with SGD-momentum and AdamW,
//     plain and with gradient clipping + 2 micro-batches through no_backward_sync, for
//     full_shard with a unit per layer (wrap_modules) and shard_grad_op with a size rule;
//   - memory: per rank, parameters, gradients and optimizer state counted from the live tensors
//     between backward and step are 1/N of DDP's (plus padding): nothing is whole then; under
//     full_shard the whole units never add up to the model;
//   - checkpoints: bitwise continuation at the same world size; a checkpoint written by 2 ranks
//     loads at 3 ranks and at 1, and training continues under plain DDP to DDP's result;
//     sharded checkpoints (the default under fsdp) read back bitwise as the full file, each
//     rank's file holds about 1/N, a damaged or unfinished one is never loaded, and a job
//     killed while writing them resumes bitwise; with bf16 wire dtypes the checkpoints still hold
//     the exact fp32 master weights;
//   - a model whose ddp state exceeds fabric.memory_limit_gb trains under full_shard, and
//     resumes from its sharded checkpoint under the same limit;
//   - empty init: a full init's values at 2 and 3 ranks (bitwise ddp's training), and a model
//     larger than fabric.tensor_memory_limit_gb sets up holding shards plus one unit and trains;
//   - cpu_offload (host shards, gradients and optimizer state): bitwise the run without it;
//   - errors: what it cannot do names the key.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <random>
#include <regex>
#include <set>
#include <string>

#include "fabric/checkpoint/sharded.h"
#include "fabric/checkpointer.h"
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
// One unit per layer (conv, fc; the BatchNorm's two vectors are the root unit).
const std::string kPerLayer =
    "fabric.strategy=fsdp fabric.fsdp.wrap_modules=Conv2d,Linear fabric.fsdp.min_unit_params=0 ";
// shard_grad_op, units by size: fc (1,085) is one, the rest (174) the root.
const std::string kBySize =
    "fabric.strategy=fsdp fabric.fsdp.sharding_strategy=shard_grad_op "
    "fabric.fsdp.min_unit_params=500 ";

class FsdpTest : public fabric::testing::ResumeHelperJob {
 protected:
  FsdpTest() : ResumeHelperJob("test.width=6") {}
};

// World size, optimizer and variant (plain; clipping + 2 micro-batches) in the four runs that
// pair every value of each with every value of the others (all eight took 28 runs of 3-4
// processes, the slowest test in CI); each against both sharding rules.
TEST_F(FsdpTest, TrainsLikeDdpWithEveryOptimizerVariantAndShardingStrategy) {
  const char* const kClipAccumulate = "test.clip_norm=0.05 test.accumulate=2";
  const struct {
    const char *world, *optimizer, *variant;
  } kRuns[] = {{"2", "sgd", ""},
               {"2", "adamw", kClipAccumulate},
               {"3", "sgd", kClipAccumulate},
               {"3", "adamw", ""}};
  for (const auto& [world, optimizer, variant] : kRuns) {
    const std::string job = std::string("fabric.devices=") + world +
                            " optimizer.name=" + optimizer + " " + variant + " ";
    auto ddp = run(job + "fabric.strategy=ddp test.out=ddp.ckpt");
    ASSERT_EQ(ddp.code, 0) << ddp.out;
    for (const std::string& sharding : {kPerLayer, kBySize}) {
      SCOPED_TRACE(job + sharding);
      auto fsdp = run(job + sharding + "test.out=fsdp.ckpt");
      ASSERT_EQ(fsdp.code, 0) << fsdp.out;
      for (const char* name : {"model", "optimizer"}) {
        const double bound = *variant == '\0' ? 0 : kClipBound;  // 0: bitwise
        EXPECT_EQ(fabric::testing::parity_failure(entry("ddp.ckpt", name), entry("fsdp.ckpt", name),
                                                  name, bound),
                  "");
      }
      if (sharding != kPerLayer || std::string(world) != "2") continue;
      // cpu_offload: the shards, gradients and optimizer state in host memory (here the
      // device is the host too, but every gather and reduce goes through its copies):
      // bitwise the run without it, clipping and micro-batches included.
      auto offload = run(job + sharding + "fabric.fsdp.cpu_offload=true test.out=off.ckpt");
      ASSERT_EQ(offload.code, 0) << offload.out;
      EXPECT_NE(offload.out.find("cpu_offload: the shards, their gradients and the optimizer "
                                 "state in host memory"),
                std::string::npos)
          << offload.out;
      for (const char* name : {"model", "optimizer"})
        EXPECT_EQ(fabric::testing::parity_failure(entry("fsdp.ckpt", name), entry("off.ckpt", name),
                                                  name, 0),
                  "");
    }
  }
}

// Every micro-batch's backward inside no_backward_sync (all), or only the last (last): the clip
// and step synchronize what no synchronized backward did (fsdp stepped with no shard gradients,
// ddp with each rank's own; ZeRO-1 lost the synchronized micro-batch's gradients), equal to ddp
// accumulating through Fabric::backward(loss, MicroBatch). fabric.sync_before_step=false keeps
// each rank's own: no longer ddp's result.
TEST_F(FsdpTest, AClipOrStepAfterUnsyncedBackwardsSynchronizesFirst) {
  // With clipping: the clip, before the step, is where the gradients must be synchronized.
  const std::string job =
      "fabric.devices=2 optimizer.name=sgd test.accumulate=2 test.clip_norm=0.05 ";
  const std::string zero1 = "fabric.strategy=ddp fabric.ddp.shard_optimizer_state=true ";
  auto ddp = run(job + "fabric.strategy=ddp test.out=ddp.ckpt");
  ASSERT_EQ(ddp.code, 0) << ddp.out;
  for (const auto& [out, args] : std::vector<std::pair<std::string, std::string>>{
           {"ddp_all.ckpt", "fabric.strategy=ddp test.unsynced=all "},
           {"fsdp_all.ckpt", kPerLayer + "test.unsynced=all "},
           {"zero1_last.ckpt", zero1 + "test.unsynced=last "},
           {"fsdp_last.ckpt", kPerLayer + "test.unsynced=last "}}) {
    auto unsynced = run(job + args + "test.out=" + out);
    ASSERT_EQ(unsynced.code, 0) << unsynced.out;
    for (const char* name : {"model", "optimizer"})
      EXPECT_EQ(fabric::testing::parity_failure(entry("ddp.ckpt", name), entry(out, name), name,
                                                kClipBound),
                "")
          << args;
  }
  auto local = run(job +
                   "fabric.strategy=ddp test.unsynced=all fabric.sync_before_step=false "
                   "test.out=local.ckpt");
  ASSERT_EQ(local.code, 0) << local.out;
  EXPECT_NE(fabric::testing::parity_failure(entry("ddp.ckpt", "model"),
                                            entry("local.ckpt", "model"), "model", kClipBound),
            "");
}

// One operator that takes parameters of every unit (torch::stack of a piece of each of 4 Table
// units, after each was used and freed again): all of them are gathered before it runs, none
// freed for another; the result matches DDP's.
TEST_F(FsdpTest, AnOperatorOverSeveralUnitsGathersThemAll) {
  const std::string job =
      "fabric.devices=3 optimizer.name=adamw test.extra_params=1000 test.extra_units=4 "
      "test.cross_units=true ";
  auto ddp = run(job + "fabric.strategy=ddp test.out=ddp.ckpt");
  ASSERT_EQ(ddp.code, 0) << ddp.out;
  auto fsdp = run(job +
                  "fabric.strategy=fsdp fabric.fsdp.wrap_modules=Conv2d,Linear,Table "
                  "fabric.fsdp.min_unit_params=0 test.out=fsdp.ckpt");
  ASSERT_EQ(fsdp.code, 0) << fsdp.out;
  EXPECT_EQ(fabric::testing::first_difference(state("ddp.ckpt"), state("fsdp.ckpt"), "state"), "");
}

// "rank R bytes parameters=P gradients=G optimizer=O" of every rank: the largest of each field.
// And "rank R fsdp units=U peak_gathered=B full=F": the largest peak, units and full.
struct Bytes {
  int64_t ranks = 0, parameters = 0, gradients = 0, optimizer = 0;
  int64_t units = 0, peak_gathered = 0, full = 0;
};
Bytes bytes(const std::string& out) {
  Bytes b;
  const std::regex fsdp(R"(rank \d+ fsdp units=(\d+) peak_gathered=(\d+) full=(\d+))");
  for (std::sregex_iterator it(out.begin(), out.end(), fsdp), end; it != end; ++it) {
    b.units = std::stoll((*it)[1]);
    b.peak_gathered = std::max(b.peak_gathered, static_cast<int64_t>(std::stoll((*it)[2])));
    b.full = std::stoll((*it)[3]);
  }
  const std::regex line(R"(rank \d+ bytes parameters=(\d+) gradients=(\d+) optimizer=(\d+))");
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
    ++b.ranks;
    b.parameters = std::max(b.parameters, static_cast<int64_t>(std::stoll((*it)[1])));
    b.gradients = std::max(b.gradients, static_cast<int64_t>(std::stoll((*it)[2])));
    b.optimizer = std::max(b.optimizer, static_cast<int64_t>(std::stoll((*it)[3])));
  }
  return b;
}

TEST_F(FsdpTest, ParametersGradientsAndOptimizerStateTakeOneNthPerRank) {
  const std::string kept = kPerLayer + "fabric.fsdp.reshard_after_forward=false ";
  for (int world : {2, 3}) {
    for (const std::string& sharding : {kPerLayer, kBySize, kept}) {
      if (sharding == kept && world == 3) continue;
      SCOPED_TRACE(std::to_string(world) + " ranks " + sharding);
      const std::string job =
          "fabric.devices=" + std::to_string(world) + " optimizer.name=adamw test.memory=true ";
      auto ddp = run(job + "fabric.strategy=ddp");
      auto fsdp = run(job + sharding);
      ASSERT_EQ(ddp.code, 0) << ddp.out;
      ASSERT_EQ(fsdp.code, 0) << fsdp.out;
      const Bytes d = bytes(ddp.out), f = bytes(fsdp.out);
      ASSERT_EQ(d.ranks, world) << ddp.out;
      ASSERT_EQ(f.ranks, world) << fsdp.out;
      // The flat layout (strategies/optimizer_shard.h, flat_layout) starts each of the model's
      // 6 parameters and each rank's part at a multiple of 128 bytes: up to 127 bytes of gap
      // each, and a rank's part up to 127 bytes over its 1/N.
      const int64_t padding = 128 * (6 + 3);
      EXPECT_LE(f.parameters, d.parameters / world + padding);
      EXPECT_LE(f.gradients, d.gradients / world + padding);
      EXPECT_LE(f.optimizer, d.optimizer / world + 2 * padding);
      EXPECT_GT(f.parameters, 0);
      // full_shard frees a unit when the next one is gathered: never the whole model at once;
      // shard_grad_op (and full_shard with reshard_after_forward: false) keeps every unit from
      // its forward until its gradients are reduced.
      if (sharding == kPerLayer) {
        EXPECT_EQ(f.units, 3) << fsdp.out;
        EXPECT_LT(f.peak_gathered, f.full * 9 / 10) << fsdp.out;
      } else if (sharding == kept) {
        EXPECT_EQ(f.units, 3) << fsdp.out;
        EXPECT_EQ(f.peak_gathered, f.full) << fsdp.out;
      } else {
        EXPECT_EQ(f.units, 2) << fsdp.out;
        EXPECT_EQ(f.peak_gathered, f.full) << fsdp.out;
      }
    }
  }
}

TEST_F(FsdpTest, SameWorldSizeResumeIsBitwiseExact) {
  const std::string job = "fabric.devices=2 optimizer.name=adamw " + kPerLayer;
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

TEST_F(FsdpTest, CheckpointsLoadAtOtherWorldSizesAndUnderPlainDdp) {
  const std::string common = "optimizer.name=adamw ";
  auto saved = run(common + kPerLayer +
                   "fabric.devices=2 checkpoint.every_n_steps=8 test.stop_at_step=8 "
                   "checkpoint.dir=two");
  ASSERT_EQ(saved.code, 0) << saved.out;
  const std::string ckpt = "two/step-00000008.ckpt";
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
  // Sharded by default under fsdp: a folder the 2 ranks wrote their parts to.
  EXPECT_TRUE(fabric::is_sharded_checkpoint(dir_ / ckpt));
  // Loaded by 3 ranks with other units, saved again at once (nothing left to train), this time
  // as one file gathered to rank 0.
  auto three =
      run(common + kBySize + "fabric.devices=3 trainer.max_steps=8 checkpoint.resume=" + ckpt +
          " checkpoint.dir=three checkpoint.format=full");
  ASSERT_EQ(three.code, 0) << three.out;
  EXPECT_TRUE(fs::is_regular_file(dir_ / "three/step-00000008.ckpt"));
  same_state("three/step-00000008.ckpt");
  auto one = run(common +
                 "fabric.devices=1 trainer.max_steps=8 "
                 "checkpoint.resume=three/step-00000008.ckpt checkpoint.dir=one");
  ASSERT_EQ(one.code, 0) << one.out;
  same_state("one/step-00000008.ckpt");
  // Training goes on from the sharded checkpoint under plain DDP as if DDP had run throughout.
  auto ddp = run(common + "fabric.strategy=ddp fabric.devices=2 test.out=ddp.ckpt");
  ASSERT_EQ(ddp.code, 0) << ddp.out;
  auto continued = run(common + "fabric.strategy=ddp fabric.devices=2 checkpoint.resume=" + ckpt +
                       " checkpoint.dir=continued test.out=continued.ckpt");
  ASSERT_EQ(continued.code, 0) << continued.out;
  EXPECT_EQ(fabric::testing::first_difference(state("ddp.ckpt"), state("continued.ckpt"), "state"),
            "");
}

// checkpoint.format: sharded (the default under fsdp) against full, on the same run: the folder
// holds a manifest, rank 0's common part and one shard file per rank, each with about 1/N of
// the parameters and optimizer state; read back, it is bitwise the full file's state.
TEST_F(FsdpTest, ShardedCheckpointsHoldEachRanksPartAndReadAsTheFullFile) {
  const std::string job =
      "fabric.devices=2 optimizer.name=adamw test.extra_params=30000 " + kPerLayer;
  auto sharded = run(job + "test.out=sharded.ckpt");
  ASSERT_EQ(sharded.code, 0) << sharded.out;
  auto full = run(job + "checkpoint.format=full test.out=full.ckpt");
  ASSERT_EQ(full.code, 0) << full.out;
  ASSERT_TRUE(fabric::is_sharded_checkpoint(dir_ / "sharded.ckpt"));
  std::set<std::string> files;
  for (const auto& e : fs::directory_iterator(dir_ / "sharded.ckpt"))
    files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"common.pt", "manifest.json", "shard-00000-of-00002.pt",
                                          "shard-00001-of-00002.pt"}));
  EXPECT_EQ(fabric::testing::compare_checkpoints(dir_ / "full.ckpt", dir_ / "sharded.ckpt"), "");
  // 31,259 parameters and two AdamW moments: ~375 kB, ~188 kB per rank.
  const auto full_bytes = static_cast<double>(fs::file_size(dir_ / "full.ckpt"));
  for (const char* shard : {"shard-00000-of-00002.pt", "shard-00001-of-00002.pt"}) {
    const auto bytes = static_cast<double>(fs::file_size(dir_ / "sharded.ckpt" / shard));
    EXPECT_GT(bytes, 0.45 * full_bytes) << shard;
    EXPECT_LT(bytes, 0.55 * full_bytes) << shard;
  }
  EXPECT_LT(static_cast<double>(fs::file_size(dir_ / "sharded.ckpt/common.pt")), 0.1 * full_bytes);
}

// fabric.fsdp.param_dtype / reduce_dtype bf16: units are gathered for compute and gradients
// reduced in bf16, while the shards keep fp32 master weights: a full checkpoint (gathered) holds
// exactly what the sharded one (each rank's shard) holds; the training differs from fp32 DDP by
// bf16 rounding, and each wire dtype alone changes it.
TEST_F(FsdpTest, WireDtypesRoundTheCollectivesButKeepExactMasterWeights) {
  // SGD: Adam's normalized steps turn the rounding of near-zero gradients into whole steps.
  const std::string common = "fabric.devices=2 optimizer.name=sgd ";
  auto ddp = run(common + "fabric.strategy=ddp test.out=ddp.ckpt");
  ASSERT_EQ(ddp.code, 0) << ddp.out;
  const std::string bf16 =
      common + kPerLayer + "fabric.fsdp.param_dtype=bf16 fabric.fsdp.reduce_dtype=bf16 ";
  auto sharded = run(bf16 + "test.out=sharded.ckpt");
  ASSERT_EQ(sharded.code, 0) << sharded.out;
  auto full = run(bf16 + "checkpoint.format=full test.out=full.ckpt");
  ASSERT_EQ(full.code, 0) << full.out;
  EXPECT_EQ(fabric::testing::compare_checkpoints(dir_ / "full.ckpt", dir_ / "sharded.ckpt"), "");
  const double both = fabric::testing::max_relative_difference(entry("ddp.ckpt", "model"),
                                                               entry("sharded.ckpt", "model"));
  // bf16 rounding shows (fp32 fsdp is bitwise ddp) and stays rounding: bf16 keeps 8 significant
  // bits (2^-8 = 3.9e-3 relative per value); kBf16Bound is 13 such roundings carried over the
  // run's 16 steps (measured: 1.9e-2, a small BatchNorm bias).
  constexpr double kBf16Bound = 5e-2;
  EXPECT_GT(both, 1e-4);
  EXPECT_LT(both, kBf16Bound);
  for (const char* one : {"fabric.fsdp.param_dtype=bf16", "fabric.fsdp.reduce_dtype=bf16"}) {
    SCOPED_TRACE(one);
    auto r = run(common + kPerLayer + one + " test.out=one.ckpt");
    ASSERT_EQ(r.code, 0) << r.out;
    const double d = fabric::testing::max_relative_difference(entry("ddp.ckpt", "model"),
                                                              entry("one.ckpt", "model"));
    EXPECT_NE(fabric::testing::first_difference(entry("ddp.ckpt", "model"),
                                                entry("one.ckpt", "model"), "model"),
              "");
    EXPECT_LT(d, kBf16Bound);
  }
}

// fabric.fsdp.prefetch over Gloo, whose collectives run beside the caller: the all-gather of the
// unit the previous pass used next starts while this one computes (forward and backward). The
// trained state is bitwise what it is without; the counts show that gathers started ahead, and
// that auto does not prefetch over the shared-memory backend (nothing to overlap there).
TEST_F(FsdpTest, PrefetchingTheNextUnitChangesNothingButWhenItIsGathered) {
  const std::string job = "fabric.devices=2 optimizer.name=adamw " + kPerLayer;
  auto ahead = [](const std::string& out) -> int64_t {
    std::smatch m;
    if (!std::regex_search(out, m,
                           std::regex("fsdp: [0-9]+ all-gathers \\(([0-9]+) started ahead")))
      return -1;
    return std::stoll(m[1]);
  };
  auto off = run(job + "fabric.ddp.cpu_backend=gloo fabric.fsdp.prefetch=false test.out=off.ckpt");
  ASSERT_EQ(off.code, 0) << off.out;
  auto on = run(job + "fabric.ddp.cpu_backend=gloo test.out=on.ckpt");
  ASSERT_EQ(on.code, 0) << on.out;
  EXPECT_EQ(fabric::testing::compare_checkpoints(dir_ / "off.ckpt", dir_ / "on.ckpt"), "");
  EXPECT_EQ(ahead(off.out), 0) << off.out;
  EXPECT_GT(ahead(on.out), 16) << on.out;  // more than one a step
  auto shm = run(job + "test.out=shm.ckpt");
  ASSERT_EQ(shm.code, 0) << shm.out;
  EXPECT_EQ(ahead(shm.out), 0) << shm.out;
}

// A sharded checkpoint with a damaged shard file, or without its manifest (its save did not
// finish), is never loaded: named in the error when asked for, skipped by resume: auto.
TEST_F(FsdpTest, ADamagedOrIncompleteShardedCheckpointIsNeverLoaded) {
  const std::string job = "fabric.devices=2 optimizer.name=adamw " + kPerLayer +
                          "checkpoint.dir=ck checkpoint.every_n_steps=4 ";
  auto first = run(job + "test.stop_at_step=8");
  ASSERT_EQ(first.code, 0) << first.out;
  const fs::path step4 = dir_ / "ck/step-00000004.ckpt", step8 = dir_ / "ck/step-00000008.ckpt";
  ASSERT_TRUE(fabric::is_sharded_checkpoint(step8)) << first.out;
  const fs::path shard = step8 / "shard-00001-of-00002.pt";
  const auto bytes = fs::file_size(shard);
  fs::resize_file(shard, bytes / 2);
  const std::string damaged = shard.string() + ": " + std::to_string(bytes / 2) +
                              " bytes, the manifest says " + std::to_string(bytes) +
                              " (damaged or replaced)";
  auto explicit_load = run(job + "checkpoint.resume=ck/step-00000008.ckpt");
  EXPECT_EQ(explicit_load.code, 1) << explicit_load.out;
  EXPECT_NE(explicit_load.out.find("error: " + damaged), std::string::npos) << explicit_load.out;
  auto automatic = run(job + "checkpoint.resume=auto");
  ASSERT_EQ(automatic.code, 0) << automatic.out;
  EXPECT_NE(automatic.out.find("warning: checkpoint.resume=auto: skipping " + damaged),
            std::string::npos)
      << automatic.out;
  EXPECT_NE(automatic.out.find("resumed from " + step4.string() + " at step 4"), std::string::npos)
      << automatic.out;
  // Without the manifest: not a checkpoint for auto (no warning), an error when named.
  fs::remove_all(dir_ / "ck");
  ASSERT_EQ(run(job + "test.stop_at_step=8").code, 0);
  fs::remove(step8 / "manifest.json");
  auto incomplete = run(job + "checkpoint.resume=ck/step-00000008.ckpt");
  EXPECT_EQ(incomplete.code, 1) << incomplete.out;
  EXPECT_NE(incomplete.out.find("error: " + step8.string() +
                                ": incomplete sharded checkpoint (no manifest.json: its save did "
                                "not finish)"),
            std::string::npos)
      << incomplete.out;
  auto skipped = run(job + "checkpoint.resume=auto");
  ASSERT_EQ(skipped.code, 0) << skipped.out;
  EXPECT_EQ(skipped.out.find("skipping"), std::string::npos) << skipped.out;
  EXPECT_NE(skipped.out.find("resumed from " + step4.string() + " at step 4"), std::string::npos)
      << skipped.out;
}

// Both ranks SIGKILL themselves after a random number of written bytes (fault injection,
// fabric/core/atomic_file.h), i.e. while writing a random sharded checkpoint: no folder a
// reader takes is ever partial, and resume: auto finishes the run bitwise like the
// uninterrupted one.
TEST_F(FsdpTest, KilledWhileWritingShardedCheckpointsResumesBitwise) {
  const std::string job = "fabric.devices=2 optimizer.name=adamw test.extra_params=200000 " +
                          kPerLayer + "checkpoint.every_n_steps=1 checkpoint.keep_last=2 ";
  auto full = run(job + "test.out=full.ckpt checkpoint.dir=full");
  ASSERT_EQ(full.code, 0) << full.out;
  int64_t shard_bytes = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "full.ckpt"))
    if (e.path().filename().string().rfind("shard-00001", 0) == 0)
      shard_bytes = static_cast<int64_t>(e.file_size());
  ASSERT_GT(shard_bytes, 0);
  std::mt19937 gen(2026);
  std::uniform_int_distribution<int64_t> byte(shard_bytes / 2, 12 * shard_bytes);
  for (int trial = 0; trial < 4; ++trial) {
    const int64_t kill_after = byte(gen);
    SCOPED_TRACE("trial " + std::to_string(trial) +
                 ": FABRIC_TEST_KILL_AFTER_BYTES=" + std::to_string(kill_after));
    const std::string runs = "runs" + std::to_string(trial);
    const std::string common = job + "logging.run_dir=" + runs + "/{name}/{timestamp} ";
    auto crashed =
        run_with_env(common, "FABRIC_TEST_KILL_AFTER_BYTES=" + std::to_string(kill_after));
    EXPECT_NE(crashed.code, 0) << crashed.out;
    bool partial = false;
    std::error_code none_yet;
    for (const auto& e : fs::recursive_directory_iterator(dir_ / runs, none_yet)) {
      const std::string name = e.path().filename().string();
      partial = partial || name.find(".ckpt.tmp.") != std::string::npos;
      if (fabric::checkpoint_step(name) >= 0 && fabric::is_sharded_checkpoint(e.path())) {
        EXPECT_NO_THROW(fabric::read_checkpoint(e.path())) << e.path();
      }
    }
    EXPECT_TRUE(partial) << crashed.out;  // it died inside a save
    auto resumed = run(common + "checkpoint.resume=auto test.out=" + runs + ".ckpt");
    ASSERT_EQ(resumed.code, 0) << resumed.out;
    EXPECT_EQ(fabric::testing::compare_checkpoints(dir_ / "full.ckpt", dir_ / (runs + ".ckpt")), "")
        << resumed.out;
    fs::remove_all(dir_ / runs);
  }
}

// 96M extra parameters (384 MB) in 8 units, AdamW, 2 ranks: ddp holds parameters, gradients,
// its buckets and two moments whole on every rank (2.15 GiB peak resident per rank by step 1,
// measured); full_shard holds half of each plus one unit (1.30 GiB through 6 steps; the test
// runs 2, saves, and resumes for a third).
// fabric.memory_limit_gb between them.
TEST_F(FsdpTest, AModelDdpCannotHoldUnderTheMemoryLimitTrainsSharded) {
  const std::string job =
      "fabric.devices=2 optimizer.name=adamw trainer.max_steps=2 test.extra_params=96000000 "
      "test.extra_units=8 checkpoint.save_last=false fabric.memory_limit_gb=1.7 ";
  auto ddp = run(job + "fabric.strategy=ddp");
  EXPECT_EQ(ddp.code, 1) << ddp.out;
  EXPECT_NE(ddp.out.find("error: fabric.memory_limit_gb: rank 0 reached"), std::string::npos)
      << ddp.out;
  const std::string fsdp_job = job + "fabric.strategy=fsdp fabric.fsdp.wrap_modules=Table ";
  auto fsdp = run(fsdp_job + "checkpoint.every_n_steps=2 checkpoint.dir=ck");
  EXPECT_EQ(fsdp.code, 0) << fsdp.out;
  EXPECT_NE(fsdp.out.find("done at step 2"), std::string::npos) << fsdp.out;
  // It resumes under the same limit: each rank reads only its part of the sharded checkpoint
  // into its shards (joining the whole state on every rank peaked at 3.4 GiB).
  ASSERT_TRUE(fabric::is_sharded_checkpoint(dir_ / "ck/step-00000002.ckpt"));
  auto resumed = run(fsdp_job + "trainer.max_steps=3 checkpoint.resume=auto checkpoint.dir=ck");
  EXPECT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("step-00000002.ckpt at step 2"), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find("done at step 3"), std::string::npos) << resumed.out;
}

// Empty init (fabric.empty_init: Fabric::init_module builds the net on the meta device, setup
// replays its construction keeping each rank's shards): the initial values are a full init's
// with the same seed at any world size, so training is bitwise ddp's with a full init.
TEST_F(FsdpTest, EmptyInitGivesAFullInitsValuesAtAnyWorldSize) {
  for (const char* world : {"2", "3"}) {
    SCOPED_TRACE(world);
    const std::string job = std::string("fabric.devices=") + world + " optimizer.name=adamw ";
    auto ddp = run(job + "fabric.strategy=ddp test.out=ddp.ckpt");
    ASSERT_EQ(ddp.code, 0) << ddp.out;
    auto fsdp = run(job + kPerLayer + "fabric.empty_init=true test.out=fsdp.ckpt");
    ASSERT_EQ(fsdp.code, 0) << fsdp.out;
    for (const char* name : {"model", "optimizer"})
      EXPECT_EQ(fabric::testing::parity_failure(entry("ddp.ckpt", name), entry("fsdp.ckpt", name),
                                                name, 0),
                "");
  }
}

// 64M extra parameters (256 MB) in 16 Table units, SGD, 4 ranks, each capped at 0.22 GiB (236
// MB) of tensors (fabric.tensor_memory_limit_gb): a full init cannot even build the model; an
// empty init sets up holding its shards (parameters and gradients, 128 MB) and one unit (16
// MB): 144,008,640 bytes measured, never the model, and trains (peak 208 MB). Weight export is
// off: it gathers the whole model on every rank.
TEST_F(FsdpTest, EmptyInitSetsUpAndTrainsAModelLargerThanTheMemoryLimit) {
  const std::string job =
      "fabric.devices=4 optimizer.name=sgd optimizer.momentum=0 trainer.max_steps=2 "
      "test.extra_params=64000000 test.extra_units=16 checkpoint.save_last=false "
      "checkpoint.export_weights=none test.peaks=true fabric.tensor_memory_limit_gb=0.22 "
      "fabric.strategy=fsdp fabric.fsdp.wrap_modules=Table ";
  auto full = run(job);
  EXPECT_EQ(full.code, 1) << full.out;
  EXPECT_NE(full.out.find("CPU out of memory: tried to allocate"), std::string::npos) << full.out;
  EXPECT_NE(full.out.find("(fabric.tensor_memory_limit_gb)"), std::string::npos) << full.out;
  auto empty = run(job + "fabric.empty_init=true");
  ASSERT_EQ(empty.code, 0) << empty.out;
  EXPECT_NE(empty.out.find("done at step 2"), std::string::npos) << empty.out;
  const int64_t model = 64000000 * 4;
  const int64_t unit = model / 16;
  std::smatch m;
  std::string rest = empty.out;
  int ranks = 0;
  while (std::regex_search(rest, m, std::regex("rank (\\d) setup_peak=(\\d+)"))) {
    const int64_t peak = std::stoll(m[2]);
    // Its shard of the parameters and of the gradients, one unit being laid out, and the
    // conv net; nothing near the model.
    EXPECT_GE(peak, model / 2 + unit) << m[0];
    EXPECT_LE(peak, model / 2 + unit + (1 << 20)) << m[0];
    ++ranks;
    rest = m.suffix();
  }
  EXPECT_EQ(ranks, 4) << empty.out;
}

TEST_F(FsdpTest, UnsupportedCombinationsNameTheKey) {
  auto r = run("fabric.devices=2 fabric.strategy=fsdp fabric.sync_batchnorm=true");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("fabric.sync_batchnorm"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not supported with fabric.strategy: fsdp"), std::string::npos) << r.out;
  // A wrap_modules name that matches no module type (a typo) would leave those modules in the
  // root unit in silence: an error naming it, the closest type and the model's types.
  r =
      run("fabric.devices=2 fabric.strategy=fsdp fabric.fsdp.wrap_modules=Conv2d,Lineer "
          "fabric.fsdp.min_unit_params=0");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("fabric.fsdp.wrap_modules: 'Lineer' is no module type of this model; did "
                       "you mean 'Linear'? (its types: "),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("'Conv2d' is no module type"), std::string::npos) << r.out;
}

}  // namespace
