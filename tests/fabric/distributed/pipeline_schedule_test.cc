// Pipeline schedules: every rank's actions cover its stages exactly, sends and recvs pair up in
// order, the lock-step simulation finishes (no deadlock) with the textbook bubble and activation
// peak, and misuse is refused with the numbers and a fix.
#include "fabric/distributed/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fabric/core/error.h"

namespace {

using fabric::distributed::parse_pipeline_schedule;
using fabric::distributed::pipeline_actions;
using fabric::distributed::pipeline_schedule_name;
using fabric::distributed::PipelineAction;
using fabric::distributed::PipelineSchedule;
using fabric::distributed::ScheduleStats;
using fabric::distributed::simulate_actions;
using fabric::distributed::simulate_pipeline;

struct Case {
  PipelineSchedule schedule;
  int64_t pp, m, v;
  std::string name() const {
    return pipeline_schedule_name(schedule) + " pp=" + std::to_string(pp) +
           " m=" + std::to_string(m) + " v=" + std::to_string(v);
  }
};

// Every valid combination of pp in {1, 2, 4}, m in 1..16 and v in {1, 2}.
std::vector<Case> valid_cases() {
  std::vector<Case> cases;
  for (int64_t pp : {1, 2, 4}) {
    for (int64_t m = 1; m <= 16; ++m) {
      cases.push_back({PipelineSchedule::kGPipe, pp, m, 1});
      if (m >= pp) cases.push_back({PipelineSchedule::kOneFOneB, pp, m, 1});
      if (m % pp == 0) {
        for (int64_t v : {1, 2})
          cases.push_back({PipelineSchedule::kInterleavedOneFOneB, pp, m, v});
      }
    }
  }
  return cases;
}

using Key = std::pair<int64_t, int64_t>;  // (stage, micro-batch)

TEST(PipelineScheduleTest, ParsesTheThreeNamesAndRefusesOthers) {
  for (PipelineSchedule s : {PipelineSchedule::kGPipe, PipelineSchedule::kOneFOneB,
                             PipelineSchedule::kInterleavedOneFOneB}) {
    EXPECT_EQ(parse_pipeline_schedule(pipeline_schedule_name(s)), s);
  }
  EXPECT_EQ(parse_pipeline_schedule("interleaved_1f1b"), PipelineSchedule::kInterleavedOneFOneB);
  try {
    parse_pipeline_schedule("1F1B");
    FAIL() << "expected fabric::Error";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "'1F1B' is not a pipeline schedule (one of gpipe, 1f1b, interleaved_1f1b)");
  }
}

TEST(PipelineScheduleTest, ForwardsAndBackwardsCoverEachStageAndMicroBatchOnce) {
  for (const Case& c : valid_cases()) {
    SCOPED_TRACE(c.name());
    for (int64_t r = 0; r < c.pp; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      std::map<Key, size_t> forward_at, backward_at;
      const auto actions = pipeline_actions(c.schedule, r, c.pp, c.m, c.v);
      for (size_t i = 0; i < actions.size(); ++i) {
        const PipelineAction& a = actions[i];
        if (a.kind == PipelineAction::kForward) {
          EXPECT_TRUE(forward_at.emplace(Key{a.stage, a.micro_batch}, i).second) << "twice";
        } else if (a.kind == PipelineAction::kBackward) {
          EXPECT_TRUE(backward_at.emplace(Key{a.stage, a.micro_batch}, i).second) << "twice";
        }
      }
      std::set<Key> expected, forwards, backwards;
      for (int64_t chunk = 0; chunk < c.v; ++chunk) {
        for (int64_t mb = 0; mb < c.m; ++mb) expected.insert({chunk * c.pp + r, mb});
      }
      for (const auto& [key, at] : forward_at) forwards.insert(key);
      for (const auto& [key, at] : backward_at) backwards.insert(key);
      EXPECT_EQ(forwards, expected);
      EXPECT_EQ(backwards, expected);
      for (const auto& [key, at] : backward_at) {
        auto f = forward_at.find(key);
        ASSERT_NE(f, forward_at.end());
        EXPECT_LT(f->second, at) << "backward of stage " << key.first << " mb " << key.second
                                 << " before its forward";
      }
    }
  }
}

TEST(PipelineScheduleTest, SendsAndRecvsPairUpInOrderBetweenNeighbours) {
  for (const Case& c : valid_cases()) {
    SCOPED_TRACE(c.name());
    const int64_t last = c.pp * c.v - 1;
    // (from, to, is_gradient) -> the tensors in order, named by their producing stage.
    std::map<std::tuple<int64_t, int64_t, bool>, std::vector<Key>> sent, received;
    for (int64_t r = 0; r < c.pp; ++r) {
      const auto actions = pipeline_actions(c.schedule, r, c.pp, c.m, c.v);
      std::set<Key> computed_forward, computed_backward;
      for (const PipelineAction& a : actions) {
        const Key key{a.stage, a.micro_batch};
        switch (a.kind) {
          case PipelineAction::kForward:
            computed_forward.insert(key);
            EXPECT_EQ(a.peer_rank, -1);
            break;
          case PipelineAction::kBackward:
            computed_backward.insert(key);
            EXPECT_EQ(a.peer_rank, -1);
            break;
          case PipelineAction::kSendActivation:
            EXPECT_LT(a.stage, last) << "the last stage computes the loss, it sends no activation";
            EXPECT_EQ(a.peer_rank, (a.stage + 1) % c.pp);
            EXPECT_TRUE(computed_forward.count(key)) << "sent before computed";
            sent[{r, a.peer_rank, false}].push_back(key);
            break;
          case PipelineAction::kRecvActivation:
            EXPECT_GT(a.stage, 0) << "stage 0 reads the batch, it receives no activation";
            EXPECT_EQ(a.peer_rank, (a.stage - 1) % c.pp);
            EXPECT_FALSE(computed_forward.count(key)) << "received after its forward";
            received[{a.peer_rank, r, false}].push_back({a.stage - 1, a.micro_batch});
            break;
          case PipelineAction::kSendGradient:
            EXPECT_GT(a.stage, 0) << "stage 0 has no input gradient to send";
            EXPECT_EQ(a.peer_rank, (a.stage - 1) % c.pp);
            EXPECT_TRUE(computed_backward.count(key)) << "sent before computed";
            sent[{r, a.peer_rank, true}].push_back(key);
            break;
          case PipelineAction::kRecvGradient:
            EXPECT_LT(a.stage, last) << "the last stage's backward starts from the loss";
            EXPECT_EQ(a.peer_rank, (a.stage + 1) % c.pp);
            EXPECT_FALSE(computed_backward.count(key)) << "received after its backward";
            received[{a.peer_rank, r, true}].push_back({a.stage + 1, a.micro_batch});
            break;
        }
        if (a.kind != PipelineAction::kForward && a.kind != PipelineAction::kBackward) {
          EXPECT_NE(a.peer_rank, r) << "a send or recv to itself";
        }
      }
    }
    // Every crossing between ranks is a send on one side and a recv on the other: m activations
    // and m gradients for each pair of consecutive stages on different ranks.
    int64_t crossings = 0;
    for (int64_t k = 0; k < last; ++k) crossings += (k % c.pp != (k + 1) % c.pp) ? 1 : 0;
    size_t sends = 0;
    for (const auto& [channel, tensors] : sent) sends += tensors.size();
    EXPECT_EQ(sends, static_cast<size_t>(2 * crossings * c.m));
    EXPECT_EQ(sent, received) << "a channel's sends and recvs differ in content or order";
  }
}

TEST(PipelineScheduleTest, OneFOneBOnTwoRanksIsTheTextbookOrder) {
  using A = PipelineAction;
  const std::vector<A> rank0 = {
      {A::kForward, 0, 0, -1},       {A::kSendActivation, 0, 0, 1}, {A::kForward, 1, 0, -1},
      {A::kSendActivation, 1, 0, 1}, {A::kRecvGradient, 0, 0, 1},   {A::kBackward, 0, 0, -1},
      {A::kForward, 2, 0, -1},       {A::kSendActivation, 2, 0, 1}, {A::kRecvGradient, 1, 0, 1},
      {A::kBackward, 1, 0, -1},      {A::kRecvGradient, 2, 0, 1},   {A::kBackward, 2, 0, -1},
  };
  const std::vector<A> rank1 = {
      {A::kRecvActivation, 0, 1, 0}, {A::kForward, 0, 1, -1},       {A::kBackward, 0, 1, -1},
      {A::kSendGradient, 0, 1, 0},   {A::kRecvActivation, 1, 1, 0}, {A::kForward, 1, 1, -1},
      {A::kBackward, 1, 1, -1},      {A::kSendGradient, 1, 1, 0},   {A::kRecvActivation, 2, 1, 0},
      {A::kForward, 2, 1, -1},       {A::kBackward, 2, 1, -1},      {A::kSendGradient, 2, 1, 0},
  };
  EXPECT_EQ(pipeline_actions(PipelineSchedule::kOneFOneB, 0, 2, 3), rank0);
  EXPECT_EQ(pipeline_actions(PipelineSchedule::kOneFOneB, 1, 2, 3), rank1);
}

TEST(PipelineScheduleTest, InterleavedFollowsTorchsChunkOrder) {
  // torch.distributed.pipelining ScheduleInterleaved1F1B, pp=2, v=2, m=4, rank 0: warm-up of
  // (v-1)*pp + 2*(pp-1-rank) = 4 forwards, rounds of pp micro-batches per chunk, backwards from
  // the last chunk. Stage 0 is chunk 0, stage 2 chunk 1.
  std::vector<std::string> computes;
  for (const PipelineAction& a :
       pipeline_actions(PipelineSchedule::kInterleavedOneFOneB, 0, 2, 4, 2)) {
    if (a.kind == PipelineAction::kForward || a.kind == PipelineAction::kBackward) {
      computes.push_back((a.kind == PipelineAction::kForward ? "F" : "B") +
                         std::to_string(a.stage) + "." + std::to_string(a.micro_batch));
    }
  }
  EXPECT_EQ(computes, (std::vector<std::string>{"F0.0", "F0.1", "F2.0", "F2.1", "F0.2", "B2.0",
                                                "F0.3", "B2.1", "F2.2", "B0.0", "F2.3", "B0.1",
                                                "B2.2", "B2.3", "B0.2", "B0.3"}));
}

TEST(PipelineScheduleTest, GPipeAndOneFOneBBubbleIsExactlyTheTheory) {
  // Forward and backward 1 unit each: makespan 2(m+pp-1), each rank busy 2m, so the idle share
  // is (pp-1)/(m+pp-1) on every rank, exactly.
  for (const Case& c : valid_cases()) {
    if (c.schedule == PipelineSchedule::kInterleavedOneFOneB) continue;
    SCOPED_TRACE(c.name());
    const ScheduleStats s = simulate_pipeline(c.schedule, c.pp, c.m, c.v);
    EXPECT_EQ(s.time_steps, 2 * (c.m + c.pp - 1));
    EXPECT_EQ(s.busy_steps_per_rank, 2 * c.m);
    EXPECT_NEAR(s.bubble_fraction,
                static_cast<double>(c.pp - 1) / static_cast<double>(c.m + c.pp - 1), 1e-12);
  }
}

TEST(PipelineScheduleTest, InterleavedBubbleIsExactlyTheTheory) {
  // Theory: (pp-1)/(v*m+pp-1), i.e. makespan 2(v*m+pp-1) in units of one virtual stage. With
  // forward = backward = 1 unit, torch's warm-up of (v-1)*pp + 2*(pp-1-rank) forwards packs the
  // pipeline exactly, so the makespan is an integer equality; the 1e-12 is only floating point.
  for (const Case& c : valid_cases()) {
    if (c.schedule != PipelineSchedule::kInterleavedOneFOneB) continue;
    SCOPED_TRACE(c.name());
    const ScheduleStats s = simulate_pipeline(c.schedule, c.pp, c.m, c.v);
    EXPECT_EQ(s.busy_steps_per_rank, 2 * c.v * c.m);
    EXPECT_EQ(s.time_steps, 2 * (c.v * c.m + c.pp - 1));
    EXPECT_NEAR(s.bubble_fraction,
                static_cast<double>(c.pp - 1) / static_cast<double>(c.v * c.m + c.pp - 1), 1e-12);
  }
  // And interleaving pays: pp=4, m=8: 1F1B idles 3/11 of the time, interleaved with v=2 3/19.
  const double one_f_one_b = simulate_pipeline(PipelineSchedule::kOneFOneB, 4, 8).bubble_fraction;
  const double interleaved =
      simulate_pipeline(PipelineSchedule::kInterleavedOneFOneB, 4, 8, 2).bubble_fraction;
  EXPECT_NEAR(one_f_one_b, 3.0 / 11, 1e-12);
  EXPECT_NEAR(interleaved, 3.0 / 19, 1e-12);
}

TEST(PipelineScheduleTest, PeakInFlightIsMForGPipeAndAtMostPpForOneFOneB) {
  for (const Case& c : valid_cases()) {
    SCOPED_TRACE(c.name());
    const ScheduleStats s = simulate_pipeline(c.schedule, c.pp, c.m, c.v);
    switch (c.schedule) {
      case PipelineSchedule::kGPipe:
        EXPECT_EQ(s.peak_in_flight, c.m);
        break;
      case PipelineSchedule::kOneFOneB:
        EXPECT_LE(s.peak_in_flight, c.pp);
        EXPECT_EQ(s.peak_in_flight, c.pp);  // rank 0, which warms up with pp-1 forwards
        break;
      case PipelineSchedule::kInterleavedOneFOneB:
        // torch's rank 0: (v-1)*pp + 2*(pp-1) warm-up forwards, then one more before its first
        // backward; all of them when that is every forward it has.
        EXPECT_EQ(s.peak_in_flight, std::min((c.v - 1) * c.pp + 2 * (c.pp - 1) + 1, c.v * c.m));
        break;
    }
  }
}

TEST(PipelineScheduleTest, OneFOneBRankHoldsPpMinusRankMicroBatches) {
  // From the order alone: forwards minus backwards so far, at most, on each rank.
  for (int64_t pp : {2, 4}) {
    for (int64_t m = pp; m <= 16; ++m) {
      for (int64_t r = 0; r < pp; ++r) {
        int64_t held = 0, peak = 0;
        for (const PipelineAction& a : pipeline_actions(PipelineSchedule::kOneFOneB, r, pp, m)) {
          if (a.kind == PipelineAction::kForward) peak = std::max(peak, ++held);
          if (a.kind == PipelineAction::kBackward) --held;
        }
        EXPECT_EQ(peak, pp - r) << "pp=" << pp << " m=" << m << " rank " << r;
      }
    }
  }
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected fabric::Error containing " << parts.front();
  } catch (const fabric::Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos) << "'" << part << "' not in: " << message;
    }
  }
}

TEST(PipelineScheduleTest, RefusesMisuseWithTheNumbersAndAFix) {
  const auto gpipe = PipelineSchedule::kGPipe;
  const auto one = PipelineSchedule::kOneFOneB;
  const auto inter = PipelineSchedule::kInterleavedOneFOneB;
  expect_error([&] { pipeline_actions(gpipe, 0, 0, 4); },
               {"pp=0 must be at least 1", "1 or more ranks"});
  expect_error([&] { pipeline_actions(gpipe, 4, 4, 4); },
               {"rank 4 is outside [0, pp=4)", "coordinate on the pp dimension"});
  expect_error([&] { pipeline_actions(gpipe, -1, 2, 4); }, {"rank -1 is outside [0, pp=2)"});
  expect_error([&] { pipeline_actions(gpipe, 0, 2, 0); },
               {"micro_batches=0 must be at least 1", "1 or more micro-batches"});
  expect_error([&] { pipeline_actions(one, 0, 4, 3); },
               {"1F1B needs at least pp micro-batches (micro_batches=3, pp=4)",
                "use micro_batches >= 4 or the gpipe schedule"});
  expect_error([&] { pipeline_actions(inter, 0, 4, 6, 2); },
               {"interleaved_1f1b needs micro_batches a multiple of pp (micro_batches=6, pp=4)",
                "use 4 or 8"});
  expect_error([&] { pipeline_actions(inter, 0, 4, 3, 2); }, {"(micro_batches=3, pp=4); use 4"});
  expect_error([&] { pipeline_actions(inter, 0, 2, 4, 0); },
               {"virtual_stages=0 must be at least 1", "use 1 (one stage per rank)"});
  expect_error([&] { pipeline_actions(one, 0, 2, 4, 2); },
               {"virtual_stages=2 needs the interleaved_1f1b schedule, not 1f1b",
                "use interleaved_1f1b or virtual_stages=1"});
  expect_error([&] { simulate_pipeline(gpipe, 2, 4, 2); },
               {"virtual_stages=2 needs the interleaved_1f1b schedule, not gpipe"});
  expect_error([&] { simulate_pipeline(one, 4, 2); }, {"(micro_batches=2, pp=4)"});
}

TEST(PipelineScheduleTest, SimulationFindsADeadlockAndNamesTheBlockedRanks) {
  using A = PipelineAction;
  // Rank 0 waits for a gradient before sending the activation it depends on.
  const std::vector<std::vector<A>> lists = {
      {{A::kRecvGradient, 0, 0, 1},
       {A::kForward, 0, 0, -1},
       {A::kSendActivation, 0, 0, 1},
       {A::kBackward, 0, 0, -1}},
      pipeline_actions(PipelineSchedule::kGPipe, 1, 2, 1),
  };
  expect_error([&] { simulate_actions(lists, 1); },
               {"deadlock at time 0", "rank 0 at recv_gradient(stage 0, mb 0) from rank 1",
                "rank 1 at recv_activation(stage 1, mb 0) from rank 0"});
}

TEST(PipelineScheduleTest, SimulationRefusesOrdersThatDisagreeOrLeaveSendsUnreceived) {
  using A = PipelineAction;
  // Rank 1 takes micro-batch 1 first while rank 0 sends micro-batch 0 first.
  auto rank1 = pipeline_actions(PipelineSchedule::kGPipe, 1, 2, 2);
  std::swap(rank1[0], rank1[2]);  // recv mb 1, forward mb 0 ... -> recv mb 1 first
  std::swap(rank1[1], rank1[3]);
  expect_error(
      [&] {
        simulate_actions({pipeline_actions(PipelineSchedule::kGPipe, 0, 2, 2), rank1}, 1);
      },
      {"rank 1 at recv_activation(stage 1, mb 1) from rank 0 but rank 0 sent stage 0 mb 0",
       "orders disagree"});
  // An extra send nobody receives.
  auto rank0 = pipeline_actions(PipelineSchedule::kGPipe, 0, 2, 1);
  rank0.insert(rank0.begin() + 2, A{A::kSendActivation, 0, 0, 1});
  expect_error(
      [&] {
        simulate_actions({rank0, pipeline_actions(PipelineSchedule::kGPipe, 1, 2, 1)}, 1);
      },
      {"rank 0 sent the activation of stage 0 mb 0 that rank 1 never receives"});
  // A stage on the wrong rank.
  expect_error(
      [&] {
        simulate_actions({{A{A::kForward, 0, 1, -1}}, {}}, 1);
      },
      {"rank 0 at forward(stage 1, mb 0)", "stage k lives on rank k % pp"});
}

TEST(PipelineScheduleTest, OneRankWithVirtualStagesHandsOffInMemory) {
  const ScheduleStats s = simulate_pipeline(PipelineSchedule::kInterleavedOneFOneB, 1, 4, 2);
  EXPECT_EQ(s.time_steps, 16);
  EXPECT_EQ(s.bubble_fraction, 0.0);
  // A backward before its stage's forward on the same rank can never run.
  using A = PipelineAction;
  expect_error(
      [&] {
        simulate_actions({{A{A::kBackward, 0, 0, -1}, A{A::kForward, 0, 0, -1}}}, 1);
      },
      {"deadlock", "rank 0 at backward(stage 0, mb 0) waits for its input"});
}

}  // namespace

namespace {

TEST(SplitStageUnitsTest, CutsBlocksEvenlyInModelOrder) {
  const auto r = fabric::distributed::split_stage_units(8, 4, "model.n_layer");
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0], (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(r[3], (std::pair<int64_t, int64_t>{6, 8}));
}

TEST(SplitStageUnitsTest, UnevenCutNamesTheCountsThatDivide) {
  try {
    fabric::distributed::split_stage_units(6, 4, "model.n_layer");
    FAIL() << "6 blocks into 4 stages was accepted";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "6 blocks (model.n_layer) do not split evenly into 4 pipeline stages; stage counts "
              "that divide 6: 1, 2, 3, 6 (pipeline_parallel_size x virtual_stages)");
  }
  EXPECT_THROW(fabric::distributed::split_stage_units(2, 4, "model.n_layer"), fabric::Error);
}

}  // namespace
