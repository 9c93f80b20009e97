// Pipeline-parallel schedules as data: the ordered forward, backward, send and recv actions of
// every rank of a pipeline, and a unit-time simulation that runs them all to prove the orders
// valid (no deadlock, every tensor received where it is used) and to measure their bubble.
//
// No communication and no model here: a pipeline runtime walks one rank's list and performs each
// action (run a stage's forward, post a send of its output, ...). The schedules follow
// torch.distributed.pipelining (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B):
//   gpipe             all forwards, then all backwards (micro-batches in order). Holds the
//                     activations of all m micro-batches at once.
//   1f1b              pp-1-rank warm-up forwards, then alternately one forward and one backward,
//                     then the remaining backwards. Holds at most pp-rank micro-batches.
//   interleaved_1f1b  each rank holds v "virtual" stages (chunks of its layers); rounds of pp
//                     micro-batches go through chunk 0, 1, ..., v-1, with torch's warm-up of
//                     (v-1)*pp + 2*(pp-1-rank) forwards. Cuts the bubble by about v.
//
// Stages: the model is cut into pp*v virtual stages, numbered 0 .. pp*v-1 in model order; virtual
// stage k lives on rank k % pp (as chunk k / pp there). Stage 0 reads the batch (it receives no
// activation), the last stage computes the loss (it sends no activation, and its backward starts
// from the loss). Between stages on different ranks, activations flow forward and gradients
// backward as send/recv pairs; between stages on one rank (pp = 1 with v > 1) the tensor stays in
// memory and no send/recv is listed.
//
//   auto actions = pipeline_actions(PipelineSchedule::kOneFOneB, /*rank=*/1, /*pp=*/4,
//                                   /*micro_batches=*/8);
//   // recv_activation(stage 1, mb 0) from 0, forward(stage 1, mb 0), send_activation(...) to 2,
//   ... ScheduleStats s = simulate_pipeline(PipelineSchedule::kOneFOneB, 4, 8, 1);
//   // s.bubble_fraction == 3.0 / 11
//
// Thread-safety: pure functions.
#ifndef FABRIC_DISTRIBUTED_PIPELINE_SCHEDULE_H_
#define FABRIC_DISTRIBUTED_PIPELINE_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fabric::distributed {

enum class PipelineSchedule { kGPipe, kOneFOneB, kInterleavedOneFOneB };

// fabric.pipeline.micro_batches: 0 (the default) is 2 x pp x virtual_stages (a 1F1B bubble of at
// most 1/3); any other count as given.
inline int64_t resolve_micro_batches(int64_t micro_batches, int64_t pp, int64_t virtual_stages) {
  return micro_batches > 0 ? micro_batches : 2 * pp * virtual_stages;
}

// "gpipe", "1f1b" or "interleaved_1f1b"; fabric::Error naming the valid ones otherwise.
PipelineSchedule parse_pipeline_schedule(const std::string& name);
// The inverse of parse_pipeline_schedule.
std::string pipeline_schedule_name(PipelineSchedule schedule);

struct PipelineAction {
  enum Kind {
    kForward,
    kBackward,
    kSendActivation,  // this rank's output of `stage` to the rank of stage + 1
    kRecvActivation,  // the input of `stage` from the rank of stage - 1
    kSendGradient,    // the gradient of `stage`'s input to the rank of stage - 1
    kRecvGradient,    // the gradient of `stage`'s output from the rank of stage + 1
  } kind;
  int64_t micro_batch;
  // The virtual stage (global, 0 .. pp*v-1) on this rank that computes, or that produces (send)
  // or consumes (recv) the tensor.
  int64_t stage;
  int64_t peer_rank;  // the other rank for send/recv; -1 for forward/backward

  bool operator==(const PipelineAction& o) const {
    return kind == o.kind && micro_batch == o.micro_batch && stage == o.stage &&
           peer_rank == o.peer_rank;
  }
};

// "forward(stage 1, mb 0)", "send_activation(stage 1, mb 0) to rank 2", ... for messages.
std::string to_string(const PipelineAction& action);

// The ordered actions of `rank` in a pipeline of `pp` ranks running `micro_batches` micro-batches
// through `virtual_stages` stages per rank.
// REQUIRES (fabric::Error naming the numbers and a fix otherwise): pp >= 1; 0 <= rank < pp;
// micro_batches >= 1; virtual_stages >= 1, and 1 unless the schedule is interleaved_1f1b; 1f1b
// needs micro_batches >= pp; interleaved_1f1b needs micro_batches a multiple of pp.
std::vector<PipelineAction> pipeline_actions(PipelineSchedule schedule, int64_t rank, int64_t pp,
                                             int64_t micro_batches, int64_t virtual_stages = 1);

// The units (a model's blocks) of each of `stages` pipeline stages in model order, as
// [begin, end) ranges of units / stages each. fabric::Error when `stages` does not divide `units`,
// one line naming `what` (e.g. "model.n_layer"), both counts and the stage counts that would
// divide it, e.g. "6 blocks (model.n_layer) do not split evenly into 4 pipeline stages; stage
// counts that divide 6: 1, 2, 3, 6 (pipeline_parallel_size x virtual_stages)".
std::vector<std::pair<int64_t, int64_t>> split_stage_units(int64_t units, int64_t stages,
                                                           const std::string& what);

struct ScheduleStats {
  int64_t time_steps = 0;           // the makespan, in units of one stage's forward
  int64_t busy_steps_per_rank = 0;  // units each rank computes (2*m*v; the most, if they differ)
  double bubble_fraction = 0;       // idle / time_steps per rank, averaged over the ranks
  // The most (virtual stage, micro-batch) pairs whose forward ran but backward did not, on any
  // rank at any time: the activations a rank holds, in units of one virtual stage's activations
  // for one micro-batch (with v = 1: micro-batches).
  int64_t peak_in_flight = 0;
};

// Runs every rank's pipeline_actions in lock-step unit time and measures them.
//
// Cost model: a forward or a backward of one virtual stage takes 1 unit; sends and recvs take 0,
// a send never blocks (buffered, as an isend), a recv blocks until its matching send happened.
// Backward is 1 unit, not the ~2 of real models, on purpose: the bubble of GPipe and 1F1B is
// (pp-1)(F+B) out of (m+pp-1)(F+B), so its fraction (pp-1)/(m+pp-1) does not depend on F:B, and
// with F = B every step of the simulation is one action, which makes the theory's numbers exact
// and the test's expectations simple. Interleaved 1F1B, with torch's warm-up, meets its theory
// (pp-1)/(v*m+pp-1) exactly in this model too: makespan 2(v*m+pp-1) units of one virtual stage
// (checked for pp <= 8, v <= 4, m <= 32). The simulation proves orders valid and shows the shape
// of the bubble; it does not predict timings (real backwards cost ~2x, sends are not free).
//
// Deadlock (every unfinished rank waits on a recv or on an input that never arrives) throws
// fabric::Error naming each blocked rank and its action; so does a recv whose channel's next
// message is another tensor (the orders on the two ranks disagree), or a send nobody receives.
ScheduleStats simulate_pipeline(PipelineSchedule schedule, int64_t pp, int64_t micro_batches,
                                int64_t virtual_stages = 1);

// The same simulation of any per-rank action lists (one list per rank, `pp` lists, stages
// 0 .. pp*virtual_stages-1 placed as above): to check a hand-written or new schedule.
ScheduleStats simulate_actions(const std::vector<std::vector<PipelineAction>>& per_rank,
                               int64_t virtual_stages);

}  // namespace fabric::distributed

#endif  // FABRIC_DISTRIBUTED_PIPELINE_SCHEDULE_H_
