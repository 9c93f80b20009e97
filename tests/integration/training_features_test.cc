// The training features end to end in the cifar10 example (docs/training.md, "Training
// features"): gradient accumulation and EMA resumed mid-epoch, activation checkpointing under ddp
// and fsdp, the recipe config, parameter groups with a plateau schedule resumed mid-epoch, and EMA
// under fsdp.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fabric/checkpoint/sharded.h"
#include "tests/checkpoint_diff.h"
#include "tests/integration/examples_fixture.h"

namespace fs = std::filesystem;

namespace {

using fabric::testing::ExamplesTest;
using fabric::testing::kTinyCifar;
using fabric::testing::Result;

// The non-empty values of `name` in a metrics.csv, by step.
std::map<int64_t, std::string> column(const fs::path& csv, const std::string& name) {
  std::ifstream in(csv);
  std::string line;
  std::map<int64_t, std::string> out;
  auto split = [](const std::string& row) {
    std::vector<std::string> cells;
    std::stringstream text(row);
    for (std::string cell; std::getline(text, cell, ',');) cells.push_back(cell);
    if (!row.empty() && row.back() == ',') cells.push_back("");
    return cells;
  };
  if (!std::getline(in, line)) return out;
  const auto header = split(line);
  const size_t at = std::find(header.begin(), header.end(), name) - header.begin();
  while (std::getline(in, line)) {
    const auto cells = split(line);
    if (at < cells.size() && !cells[at].empty()) out[std::stoll(cells[0])] = cells[at];
  }
  return out;
}

// trainer.accumulate_grad_batches: 3 batches per optimizer step over 2 ranks (4 batches per rank
// and epoch: groups of 3 and 1) with trainer.ema_decay, resumed from a checkpoint in the middle of
// an epoch (step 3: 3 of its 4 batches taken), ends with weights and averaged weights bitwise
// those of the uninterrupted run; max_steps counts optimizer steps.
TEST_F(ExamplesTest, Cifar10AccumulationAndEmaResumeBitwise) {
  const std::string args =
      std::string("--config=ddp.yaml fabric.accelerator=cpu") + kTinyCifar +
      " trainer.max_epochs=3 trainer.max_steps=5 trainer.accumulate_grad_batches=3"
      " checkpoint.every_n_steps=3 trainer.ema_decay=0.9";
  ASSERT_TRUE(expect_resume_bitwise("cifar10", args, 3, 5));
  const std::string a = bytes(dir_ / "whole" / "weights.pt");
  const std::string ema = bytes(dir_ / "whole" / "weights_ema.pt");
  ASSERT_FALSE(ema.empty());
  EXPECT_TRUE(ema == bytes(dir_ / "resumed" / "weights_ema.pt"));
  EXPECT_FALSE(ema == a);  // the average is not the last weights
}

// A mid-epoch checkpoint resumed in another shape (trainer.accumulate_grad_batches 1 → 2; one rank
// → two) trains the rest of the epoch's data: the step count is made from where the run stands
// (3 + ceil(5 / 2) = 6; 2 + 3 = 5), not from a fresh run's plan (4), and the micro-batches group
// from the resumed batch (an accumulation group started mid-group crashed).
TEST_F(ExamplesTest, Cifar10MidEpochResumeInAnotherShapeTrainsTheRestOfTheEpoch) {
  const std::string one = std::string("--config=single_cpu.yaml") + kTinyCifar +
                          " trainer.max_epochs=1 checkpoint.export_weights=none";
  Result first = run("cifar10", one + " checkpoint.every_n_steps=3 checkpoint.dir=first");
  ASSERT_EQ(first.code, 0) << first.out;
  Result accumulated =
      run("cifar10", one +
                         " trainer.max_steps=-1 trainer.accumulate_grad_batches=2 "
                         "checkpoint.resume=first/step-00000003.ckpt checkpoint.dir=acc");
  ASSERT_EQ(accumulated.code, 0) << accumulated.out;
  EXPECT_EQ(summary_of(accumulated)["steps"], 6) << accumulated.out;
  EXPECT_NE(accumulated.out.find("6 steps in all, not the 4 a fresh run plans"), std::string::npos)
      << accumulated.out;
  Result second = run("cifar10", one + " checkpoint.every_n_steps=2 checkpoint.dir=second");
  ASSERT_EQ(second.code, 0) << second.out;
  Result wider =
      run("cifar10", std::string("--config=ddp.yaml fabric.accelerator=cpu") + kTinyCifar +
                         " trainer.max_epochs=1 checkpoint.export_weights=none "
                         "trainer.max_steps=-1 checkpoint.dir=wider "
                         "checkpoint.resume=second/step-00000002.ckpt");
  ASSERT_EQ(wider.code, 0) << wider.out;
  EXPECT_EQ(summary_of(wider)["steps"], 5) << wider.out;
  // Rank 1's own load warning (no generator state saved for it) reaches its log.
  std::string rank1;
  for (const auto& e : fs::recursive_directory_iterator(dir_))
    if (e.path().filename() == "rank_1.log") rank1 += bytes(e.path());
  EXPECT_NE(rank1.find("warning: rank 1: "), std::string::npos) << rank1;
  EXPECT_NE(rank1.find("no random generator state for rank 1"), std::string::npos) << rank1;
}

// model.activation_checkpointing: [BasicBlock] under ddp over 2 ranks (SyncBatchNorm off, BatchNorm
// running statistics restored after each recomputation) and under fsdp over 2 ranks (units small
// enough that blocks are gathered again for the recomputation) trains to weights bitwise those of
// the same run keeping its activations.
TEST_F(ExamplesTest, Cifar10ActivationCheckpointingUnderDdpAndFsdpIsBitwiseThePlainRun) {
  for (const std::string config : {"ddp.yaml", "fsdp.yaml fabric.fsdp.min_unit_params=100"}) {
    const std::string args = "--config=" + config + " fabric.accelerator=cpu" + kTinyCifar;
    const std::string name = config.substr(0, config.find('.'));
    Result plain = run("cifar10", args + " logging.run_dir=plain_" + name);
    ASSERT_EQ(plain.code, 0) << plain.out;
    Result ckpt = run("cifar10", args + " logging.run_dir=ckpt_" + name +
                                     " model.activation_checkpointing=[BasicBlock]");
    ASSERT_EQ(ckpt.code, 0) << ckpt.out;
    const std::string a = bytes(dir_ / ("plain_" + name) / "weights.pt");
    ASSERT_FALSE(a.empty()) << plain.out;
    EXPECT_TRUE(a == bytes(dir_ / ("ckpt_" + name) / "weights.pt")) << config << "\n" << ckpt.out;
  }
}

// The recipe config (cosine + warm-up, accumulation, EMA, checkpointed blocks) runs and writes
// both weight files.
TEST_F(ExamplesTest, Cifar10RecipeConfigRunsWithEveryTrainingFeature) {
  Result r = run("cifar10", std::string("--config=cifar10_recipe.yaml") + kTinyCifar);
  ASSERT_EQ(r.code, 0) << r.out;
  auto s = summary_of(r);
  EXPECT_EQ(s["steps"], 3);
  EXPECT_DOUBLE_EQ(s["ema_decay"].get<double>(), 0.99);
  const fs::path run_dir = fs::path(r.last_line()).parent_path();
  EXPECT_TRUE(fs::exists(run_dir / "weights.pt")) << r.out;
  EXPECT_TRUE(fs::exists(run_dir / "weights_ema.pt")) << r.out;
}

// optimizer.no_weight_decay and optimizer.lr_scale (four parameter groups) with scheduler.name:
// plateau watching the training loss (a threshold no epoch meets, so every evaluation after the
// first halves the rate) over 2 ranks (4 steps per epoch), resumed from the checkpoint at step 6
// (the middle of epoch 2: the plateau state of epoch 1 and the loss sum of steps 5-6 in it), ends
// with weights bitwise those of the uninterrupted run; the rate was halved after epoch 2.
TEST_F(ExamplesTest, Cifar10ParamGroupsAndPlateauResumeBitwise) {
  const std::string args =
      std::string("--config=ddp.yaml fabric.accelerator=cpu") + kTinyCifar +
      " trainer.max_epochs=3 trainer.max_steps=-1 checkpoint.every_n_steps=6"
      " optimizer.weight_decay=0.0005 'optimizer.no_weight_decay=[\"*.bias\", \"type:*Norm*\"]'"
      " 'optimizer.lr_scale=[\"fc.*=3\"]' scheduler.name=plateau scheduler.monitor=train/loss"
      " scheduler.patience=0 scheduler.threshold=0.9 scheduler.gamma=0.5 scheduler.warmup_steps=0";
  ASSERT_TRUE(expect_resume_bitwise("cifar10", args, 6, 12));

  // metrics.csv: the rate halved after epoch 2; the value reported to the scheduler at the end of
  // epochs 2 and 3 (the mean training loss since the previous evaluation, part of it from before
  // the resume) is the uninterrupted run's.
  const auto whole_lr = column(dir_ / "whole" / "metrics.csv", "lr");
  ASSERT_TRUE(whole_lr.count(1) && whole_lr.count(12)) << bytes(dir_ / "whole" / "metrics.csv");
  EXPECT_NEAR(std::stod(whole_lr.at(12)) / std::stod(whole_lr.at(1)), 0.5, 1e-6);
  const auto a_reported = column(dir_ / "whole" / "metrics.csv", "scheduler/monitored");
  const auto b_reported = column(dir_ / "resumed" / "metrics.csv", "scheduler/monitored");
  for (int64_t step : {8, 12}) {
    ASSERT_TRUE(a_reported.count(step) && b_reported.count(step)) << step;
    EXPECT_EQ(a_reported.at(step), b_reported.at(step)) << "step " << step;
  }
}

// trainer.ema_decay under fsdp over 2 ranks, units small enough that parameters are split at
// odd places: each rank averages the part of each parameter it holds. The averaged weights are
// bitwise ddp's averages (fsdp's pieces are cut where ddp's kernels cut the parameters, so each
// element takes the same arithmetic: fsdp_test's parity comment), and a mid-epoch resume from a
// sharded checkpoint (each rank's part a piece) ends with both weight files bitwise the
// uninterrupted run's.
TEST_F(ExamplesTest, Cifar10EmaUnderFsdpEqualsDdpAndResumesBitwise) {
  const std::string common = std::string(" fabric.accelerator=cpu") + kTinyCifar +
                             " trainer.max_epochs=3 trainer.max_steps=5"
                             " checkpoint.every_n_steps=3 trainer.ema_decay=0.9";
  Result ddp = run("cifar10", "--config=ddp.yaml" + common + " logging.run_dir=ddp");
  ASSERT_EQ(ddp.code, 0) << ddp.out;
  ASSERT_TRUE(expect_resume_bitwise(
      "cifar10", "--config=fsdp.yaml fabric.fsdp.min_unit_params=100" + common, 3, 5));
  const std::string ema = bytes(dir_ / "whole" / "weights_ema.pt");
  ASSERT_FALSE(ema.empty());
  EXPECT_TRUE(ema == bytes(dir_ / "resumed" / "weights_ema.pt"));
  const auto fsdp_ema = fabric::read_checkpoint(dir_ / "whole" / "weights_ema.pt");
  const auto ddp_ema = fabric::read_checkpoint(dir_ / "ddp" / "weights_ema.pt");
  const auto fsdp_last = fabric::read_checkpoint(dir_ / "whole" / "weights.pt");
  const auto ddp_last = fabric::read_checkpoint(dir_ / "ddp" / "weights.pt");
  EXPECT_EQ(fabric::testing::first_difference(fsdp_ema, ddp_ema, "ema"), "");
  EXPECT_EQ(fabric::testing::first_difference(fsdp_last, ddp_last, "weights"), "");
  EXPECT_GT(fabric::testing::max_relative_difference(fsdp_ema, fsdp_last), 1e-3);  // an average
}

// The same with checkpoint.format: full: each rank's parts of the averages are gathered into one
// file, which a resumed fsdp run splits again (bitwise) and a ddp run loads whole.
TEST_F(ExamplesTest, Cifar10EmaUnderFsdpInOneFileCheckpointsResumesBitwise) {
  const std::string common = std::string(" fabric.accelerator=cpu") + kTinyCifar +
                             " trainer.max_epochs=3 trainer.max_steps=5"
                             " checkpoint.every_n_steps=3 trainer.ema_decay=0.9"
                             " checkpoint.format=full";
  ASSERT_TRUE(expect_resume_bitwise(
      "cifar10", "--config=fsdp.yaml fabric.fsdp.min_unit_params=100" + common, 3, 5));
  EXPECT_TRUE(bytes(dir_ / "whole" / "weights_ema.pt") ==
              bytes(dir_ / "resumed" / "weights_ema.pt"));
  const fs::path ckpt = dir_ / "whole" / "checkpoints" / "step-00000003.ckpt";
  ASSERT_TRUE(fs::is_regular_file(ckpt));
  Result ddp = run("cifar10", "--config=ddp.yaml" + common +
                                  " logging.run_dir=ddp checkpoint.resume=" + ckpt.string());
  ASSERT_EQ(ddp.code, 0) << ddp.out;
  const auto fsdp_ema = fabric::read_checkpoint(dir_ / "whole" / "weights_ema.pt");
  const auto ddp_ema = fabric::read_checkpoint(dir_ / "ddp" / "weights_ema.pt");
  // ddp resumed from fsdp's step-3 checkpoint goes on bitwise as fsdp did.
  EXPECT_EQ(fabric::testing::first_difference(fsdp_ema, ddp_ema, "ema"), "");
}

}  // namespace
