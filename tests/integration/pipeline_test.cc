// Pipeline parallelism in real processes (pipeline_helper): the tiny GPT cut into stages over 2
// and 4 ranks (and 2 on one rank) trains as one process does after 10 SGD steps, under
// GPipe, 1F1B and interleaved 1F1B (2 virtual stages per rank), and pp 2 x dp 2 and pp 2 x tp 2
// as one process on the whole batch does (ddp's equal):
//   - losses within 1e-6 (relative: the loss is about 5.5, where float32's spacing is 4.8e-7) and
//     parameters within 1e-6 of one process on the whole batch (SGD lr 0.1, momentum 0.9);
//   - after the first step, bitwise equal to one process accumulating the same micro-batches,
//     except the tied token embedding where two ranks hold it (its two gradients are summed
//     after all micro-batches, not in between; from step 2 on that difference reaches every
//     parameter through the forward);
//   - each rank holds its stages' parameters only: over the ranks they add up to the model plus
//     one copy of the tied embedding;
//   - the activations a rank holds at once: all m micro-batches' under GPipe, pp - rank under 1F1B;
//   - gradients clipped over the whole pipeline take one process's norm (1e-6 relative);
//   - evaluation (forwards only, PipelineRunner::evaluate) of a new batch gives one process's
//     loss (1e-6 relative) and leaves the gradients alone.
#include <gtest/gtest.h>

#include <string>

#include "tests/run_command.h"

namespace {

double number_after(const std::string& out, const std::string& key) {
  const std::string v = fabric::testing::value_after(out, key);
  return v.empty() ? -1.0 : std::stod(v);
}

constexpr double kEmbeddingBytes = 256 * 64 * 4;  // the tiny models' vocabulary x width, float32

void expect_parity(int world, int pp, const std::string& schedule, int m, int v = 1, int tp = 1,
                   const std::string& model = "gpt", double clip = 0) {
  const bool tied = model == "gpt" || model == "llama_tied";
  const std::string tied_name =
      model == "gpt" ? "transformer.wte.weight" : "model.embed_tokens.weight";
  const std::string exe = fabric::testing::helper_binary("//tests/integration:pipeline_helper");
  const std::string args = std::to_string(world) + " " + std::to_string(pp) + " " + schedule + " " +
                           std::to_string(m) + " " + std::to_string(v) + " 10 4 " +
                           std::to_string(tp) + " " + model +
                           (clip > 0 ? " " + std::to_string(clip) : std::string());
  const auto r = fabric::testing::run_command(exe + " " + args);
  ASSERT_EQ(r.code, 0) << args << "\n" << r.out;
  const int dp = world / pp / tp;
  double bytes = 0, whole = 0;
  for (int rank = 0; rank < world; ++rank) {
    const std::string line = fabric::testing::value_after(
        r.out, "rank " + std::to_string(rank) + " of " + std::to_string(world) + ": ");
    ASSERT_FALSE(line.empty()) << "rank " << rank << " did not report:\n" << r.out;
    SCOPED_TRACE(args + ": " + line);
    for (const char* key : {"max_loss_rel=", "max_param_diff=", "eval_rel="}) {
      const double d = number_after(line, key);
      EXPECT_GE(d, 0.0) << key << " missing";
      EXPECT_LE(d, 1e-6) << key;
    }
    const int pp_rank = rank / (dp * tp);
    if (clip > 0) {
      // Clipping acted (the norm above the bound), on the pipeline's norm over every stage.
      const double norm = number_after(line, "first_norm="),
                   mine = number_after(line, "pipeline_first_norm=");
      EXPECT_GT(norm, clip);
      EXPECT_NEAR(mine, norm, 1e-6 * norm);
    }
    if (dp == 1 && tp == 1 && clip == 0) {
      const double differ = number_after(line, "accumulated_differ=");
      // The first and the last stage each use a tied embedding (one rank's, or two copies).
      const bool holds_it_twice = tied && pp * v > 1 && (pp_rank == 0 || pp_rank == pp - 1);
      if (holds_it_twice) {
        EXPECT_LE(differ, 1);
        if (differ == 1) {
          EXPECT_NE(line.find("[" + tied_name + "]"), std::string::npos);
        }
      } else {
        EXPECT_EQ(differ, 0);
      }
    }
    if (rank % (dp * tp) == 0) bytes += number_after(line, "param_bytes=");  // one replica
    whole = number_after(line, "whole_bytes=");
    const double peak = number_after(line, "peak_in_flight=");
    if (schedule == "gpipe") {
      EXPECT_EQ(peak, m);
    }
    if (schedule == "1f1b") {
      EXPECT_EQ(peak, std::min(m, pp - pp_rank));
    }
  }
  if (tp == 1) {
    EXPECT_EQ(bytes, whole + (tied && pp > 1 ? kEmbeddingBytes : 0)) << args;
  }
}

TEST(PipelineTest, TwoStagesGPipe) { expect_parity(2, 2, "gpipe", 4); }

TEST(PipelineTest, TwoStagesOneFOneB) { expect_parity(2, 2, "1f1b", 4); }

TEST(PipelineTest, FourStagesGPipeAndOneFOneB) {
  expect_parity(4, 4, "gpipe", 4);
  expect_parity(4, 4, "1f1b", 8);
}

TEST(PipelineTest, InterleavedTwoVirtualStagesPerRank) {
  expect_parity(2, 2, "interleaved_1f1b", 4, 2);
}

// Two virtual stages on one rank: the activation and its gradient handed over in memory.
TEST(PipelineTest, OneRankTwoVirtualStages) { expect_parity(1, 1, "interleaved_1f1b", 2, 2); }

TEST(PipelineTest, PipelineTimesDataParallelEqualsDdp) { expect_parity(4, 2, "1f1b", 2); }

// Each stage's blocks and the vocabulary split over tp 2 (the GPT's plan), then cut by pp 2.
TEST(PipelineTest, PipelineTimesTensorParallelEqualsOneProcess) {
  expect_parity(4, 2, "1f1b", 2, 1, 2);
}

// Llama (grouped-query attention, its own lm_head: nothing tied between the stages) and a tied
// one (Qwen2's small models): the embedding's two copies summed as the GPT's are.
TEST(PipelineTest, LlamaStagesUntiedAndTied) {
  expect_parity(2, 2, "1f1b", 4, 1, 1, "llama");
  expect_parity(2, 2, "interleaved_1f1b", 4, 2, 1, "llama_tied");
}

// Gradient clipping over the whole pipeline (PipelineRunner::clip_grad_norm): the norm of every
// stage's gradients, a tied embedding counted once, as one process's clip_grad_norm_.
TEST(PipelineTest, ClippingTakesTheNormOverAllStages) {
  expect_parity(2, 2, "1f1b", 4, 1, 1, "gpt", 0.5);
  expect_parity(4, 4, "gpipe", 4, 1, 1, "llama_tied", 0.5);
}

// A user's model as a torch::nn::Sequential cut at a split point (SequentialStages).
TEST(PipelineTest, ASequentialCutAtASplitPoint) {
  expect_parity(2, 2, "1f1b", 4, 1, 1, "sequential");
}

}  // namespace
