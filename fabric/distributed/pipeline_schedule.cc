#include "fabric/distributed/pipeline_schedule.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fabric/core/error.h"

namespace fabric::distributed {
namespace {

using Kind = PipelineAction::Kind;

std::string kind_name(Kind kind) {
  switch (kind) {
    case PipelineAction::kForward:
      return "forward";
    case PipelineAction::kBackward:
      return "backward";
    case PipelineAction::kSendActivation:
      return "send_activation";
    case PipelineAction::kRecvActivation:
      return "recv_activation";
    case PipelineAction::kSendGradient:
      return "send_gradient";
    case PipelineAction::kRecvGradient:
      return "recv_gradient";
  }
  return "?";
}

bool is_compute(Kind kind) {
  return kind == PipelineAction::kForward || kind == PipelineAction::kBackward;
}

void validate(PipelineSchedule schedule, int64_t rank, int64_t pp, int64_t m, int64_t v) {
  const std::string name = pipeline_schedule_name(schedule);
  auto fail = [](const std::string& message) { throw Error("pipeline: " + message); };
  if (pp < 1) {
    fail("pp=" + std::to_string(pp) +
         " must be at least 1; give the pipeline dimension 1 or more ranks");
  }
  if (rank < 0 || rank >= pp) {
    fail("rank " + std::to_string(rank) + " is outside [0, pp=" + std::to_string(pp) +
         "); pass this rank's coordinate on the pp dimension");
  }
  if (m < 1) {
    fail("micro_batches=" + std::to_string(m) +
         " must be at least 1; split the batch into 1 or more micro-batches");
  }
  if (v < 1) {
    fail("virtual_stages=" + std::to_string(v) +
         " must be at least 1; use 1 (one stage per rank), or more with interleaved_1f1b");
  }
  if (v > 1 && schedule != PipelineSchedule::kInterleavedOneFOneB) {
    fail("virtual_stages=" + std::to_string(v) + " needs the interleaved_1f1b schedule, not " +
         name + "; use interleaved_1f1b or virtual_stages=1");
  }
  if (schedule == PipelineSchedule::kOneFOneB && m < pp) {
    fail("1F1B needs at least pp micro-batches (micro_batches=" + std::to_string(m) +
         ", pp=" + std::to_string(pp) + "); use micro_batches >= " + std::to_string(pp) +
         " or the gpipe schedule");
  }
  if (schedule == PipelineSchedule::kInterleavedOneFOneB && m % pp != 0) {
    const int64_t below = m / pp * pp;
    const int64_t above = below + pp;
    fail("interleaved_1f1b needs micro_batches a multiple of pp (micro_batches=" +
         std::to_string(m) + ", pp=" + std::to_string(pp) + "); use " +
         (below > 0 ? std::to_string(below) + " or " : std::string()) + std::to_string(above));
  }
}

struct Compute {
  bool forward;
  int64_t stage;
  int64_t micro_batch;
};

// The order of forwards and backwards on one rank, as torch.distributed.pipelining orders them.
std::vector<Compute> compute_order(PipelineSchedule schedule, int64_t rank, int64_t pp, int64_t m,
                                   int64_t v) {
  std::vector<Compute> order;
  switch (schedule) {
    case PipelineSchedule::kGPipe:
      for (int64_t i = 0; i < m; ++i) order.push_back({true, rank, i});
      for (int64_t i = 0; i < m; ++i) order.push_back({false, rank, i});
      break;
    case PipelineSchedule::kOneFOneB: {
      const int64_t warmup = pp - 1 - rank;  // < m, validated
      for (int64_t i = 0; i < warmup; ++i) order.push_back({true, rank, i});
      for (int64_t i = 0; i < m - warmup; ++i) {
        order.push_back({true, rank, warmup + i});
        order.push_back({false, rank, i});
      }
      for (int64_t i = m - warmup; i < m; ++i) order.push_back({false, rank, i});
      break;
    }
    case PipelineSchedule::kInterleavedOneFOneB: {
      // ScheduleInterleaved1F1B: rounds of pp micro-batches per chunk; forwards go chunk 0 .. v-1,
      // backwards chunk v-1 .. 0. Each chunk takes its micro-batches in order.
      const int64_t total = m * v;
      const int64_t warmup = std::min((v - 1) * pp + 2 * (pp - 1 - rank), total);
      std::vector<int64_t> next_forward(v, 0), next_backward(v, 0);
      auto forward = [&](int64_t op) {
        const int64_t chunk = (op / pp) % v;
        order.push_back({true, chunk * pp + rank, next_forward[chunk]++});
      };
      auto backward = [&](int64_t op) {
        const int64_t chunk = v - 1 - (op / pp) % v;
        order.push_back({false, chunk * pp + rank, next_backward[chunk]++});
      };
      for (int64_t op = 0; op < warmup; ++op) forward(op);
      for (int64_t op = warmup; op < total; ++op) {
        forward(op);
        backward(op - warmup);
      }
      for (int64_t op = total - warmup; op < total; ++op) backward(op);
      break;
    }
  }
  return order;
}

std::string where(int64_t rank, const PipelineAction& a) {
  return "rank " + std::to_string(rank) + " at " + to_string(a);
}

}  // namespace

PipelineSchedule parse_pipeline_schedule(const std::string& name) {
  if (name == "gpipe") return PipelineSchedule::kGPipe;
  if (name == "1f1b") return PipelineSchedule::kOneFOneB;
  if (name == "interleaved_1f1b") return PipelineSchedule::kInterleavedOneFOneB;
  throw Error("'" + one_line(name, 40) +
              "' is not a pipeline schedule (one of gpipe, 1f1b, interleaved_1f1b)");
}

std::string pipeline_schedule_name(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::kGPipe:
      return "gpipe";
    case PipelineSchedule::kOneFOneB:
      return "1f1b";
    case PipelineSchedule::kInterleavedOneFOneB:
      return "interleaved_1f1b";
  }
  return "?";
}

std::string to_string(const PipelineAction& a) {
  std::string s = kind_name(a.kind) + "(stage " + std::to_string(a.stage) + ", mb " +
                  std::to_string(a.micro_batch) + ")";
  if (a.kind == PipelineAction::kSendActivation || a.kind == PipelineAction::kSendGradient) {
    s += " to rank " + std::to_string(a.peer_rank);
  } else if (!is_compute(a.kind)) {
    s += " from rank " + std::to_string(a.peer_rank);
  }
  return s;
}

std::vector<PipelineAction> pipeline_actions(PipelineSchedule schedule, int64_t rank, int64_t pp,
                                             int64_t micro_batches, int64_t virtual_stages) {
  validate(schedule, rank, pp, micro_batches, virtual_stages);
  const int64_t last = pp * virtual_stages - 1;
  auto owner = [pp](int64_t stage) { return stage % pp; };
  std::vector<PipelineAction> actions;
  // Each recv sits right before the compute that needs it and each send right after the one
  // that produced it: sends are asynchronous, so this blocks a rank no earlier than its data.
  for (const Compute& c : compute_order(schedule, rank, pp, micro_batches, virtual_stages)) {
    const int64_t mb = c.micro_batch, k = c.stage;
    if (c.forward) {
      if (k > 0 && owner(k - 1) != rank) {
        actions.push_back({PipelineAction::kRecvActivation, mb, k, owner(k - 1)});
      }
      actions.push_back({PipelineAction::kForward, mb, k, -1});
      if (k < last && owner(k + 1) != rank) {
        actions.push_back({PipelineAction::kSendActivation, mb, k, owner(k + 1)});
      }
    } else {
      if (k < last && owner(k + 1) != rank) {
        actions.push_back({PipelineAction::kRecvGradient, mb, k, owner(k + 1)});
      }
      actions.push_back({PipelineAction::kBackward, mb, k, -1});
      if (k > 0 && owner(k - 1) != rank) {
        actions.push_back({PipelineAction::kSendGradient, mb, k, owner(k - 1)});
      }
    }
  }
  return actions;
}

std::vector<std::pair<int64_t, int64_t>> split_stage_units(int64_t units, int64_t stages,
                                                           const std::string& what) {
  if (stages >= 1 && units >= stages && units % stages == 0) {
    std::vector<std::pair<int64_t, int64_t>> out;
    const int64_t each = units / stages;
    for (int64_t k = 0; k < stages; ++k) out.emplace_back(k * each, (k + 1) * each);
    return out;
  }
  std::string divisors;
  for (int64_t d = 1; d <= units; ++d)
    if (units % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
  throw Error(std::to_string(units) + " blocks (" + what + ") do not split evenly into " +
              std::to_string(stages) + " pipeline stages; stage counts that divide " +
              std::to_string(units) + ": " + (divisors.empty() ? "none" : divisors) +
              " (pipeline_parallel_size x virtual_stages)");
}

ScheduleStats simulate_pipeline(PipelineSchedule schedule, int64_t pp, int64_t micro_batches,
                                int64_t virtual_stages) {
  validate(schedule, 0, pp, micro_batches, virtual_stages);
  std::vector<std::vector<PipelineAction>> per_rank;
  for (int64_t r = 0; r < pp; ++r) {
    per_rank.push_back(pipeline_actions(schedule, r, pp, micro_batches, virtual_stages));
  }
  return simulate_actions(per_rank, virtual_stages);
}

ScheduleStats simulate_actions(const std::vector<std::vector<PipelineAction>>& per_rank,
                               int64_t virtual_stages) {
  const int64_t pp = static_cast<int64_t>(per_rank.size());
  if (pp < 1 || virtual_stages < 1) {
    throw Error("pipeline simulation: needs at least one rank's actions and virtual_stages >= 1 (" +
                std::to_string(pp) + " lists, virtual_stages=" + std::to_string(virtual_stages) +
                ")");
  }
  const int64_t last = pp * virtual_stages - 1;
  using Key = std::pair<int64_t, int64_t>;  // (stage, micro-batch)
  struct Rank {
    size_t next = 0;
    int64_t busy_until = 0;
    int64_t busy = 0;
    std::set<Key> forward_done, backward_done, activation_in, gradient_in;
  };
  std::vector<Rank> ranks(pp);
  for (int64_t r = 0; r < pp; ++r) {
    for (const PipelineAction& a : per_rank[r]) {
      const bool send_or_recv = !is_compute(a.kind);
      if (a.stage < 0 || a.stage > last || a.stage % pp != r ||
          (send_or_recv && (a.peer_rank < 0 || a.peer_rank >= pp))) {
        throw Error("pipeline simulation: " + where(r, a) + " names a stage or peer that " +
                    "rank " + std::to_string(r) + " does not have (pp=" + std::to_string(pp) +
                    ", virtual_stages=" + std::to_string(virtual_stages) +
                    "; stage k lives on rank k % pp)");
      }
    }
  }
  // (from, to, is_gradient) -> the (stage, micro-batch) tensors sent and not yet received.
  std::map<std::tuple<int64_t, int64_t, bool>, std::deque<Key>> channels;
  ScheduleStats stats;
  int64_t in_flight_peak = 0;
  std::vector<int64_t> in_flight(pp, 0);

  for (int64_t t = 0;; ++t) {
    bool progress = true, any_progress = false;
    // Sends and recvs take no time: repeat until no free rank can do one more.
    while (progress) {
      progress = false;
      for (int64_t r = 0; r < pp; ++r) {
        Rank& rk = ranks[r];
        while (rk.busy_until <= t && rk.next < per_rank[r].size()) {
          const PipelineAction& a = per_rank[r][rk.next];
          const Key key{a.stage, a.micro_batch};
          if (a.kind == PipelineAction::kSendActivation ||
              a.kind == PipelineAction::kSendGradient) {
            const bool gradient = a.kind == PipelineAction::kSendGradient;
            const std::set<Key>& produced = gradient ? rk.backward_done : rk.forward_done;
            if (!produced.count(key)) {
              throw Error("pipeline simulation: " + where(r, a) + " sends what its " +
                          (gradient ? "backward" : "forward") +
                          " has not computed yet; put the send after it");
            }
            channels[{r, a.peer_rank, gradient}].push_back(key);
          } else if (a.kind == PipelineAction::kRecvActivation ||
                     a.kind == PipelineAction::kRecvGradient) {
            const bool gradient = a.kind == PipelineAction::kRecvGradient;
            auto& channel = channels[{a.peer_rank, r, gradient}];
            if (channel.empty()) break;  // blocked
            const Key expected{gradient ? a.stage + 1 : a.stage - 1, a.micro_batch};
            if (channel.front() != expected) {
              throw Error("pipeline simulation: " + where(r, a) + " but rank " +
                          std::to_string(a.peer_rank) + " sent stage " +
                          std::to_string(channel.front().first) + " mb " +
                          std::to_string(channel.front().second) +
                          " first; the two ranks' orders disagree");
            }
            channel.pop_front();
            (gradient ? rk.gradient_in : rk.activation_in).insert(key);
          } else {
            break;  // a compute: started below
          }
          ++rk.next;
          progress = any_progress = true;
        }
      }
    }
    // Free ranks start their next compute when its inputs are there.
    bool busy = false, done = true;
    for (int64_t r = 0; r < pp; ++r) {
      Rank& rk = ranks[r];
      if (rk.busy_until <= t && rk.next < per_rank[r].size()) {
        const PipelineAction& a = per_rank[r][rk.next];
        const Key key{a.stage, a.micro_batch};
        bool ready = false;
        if (a.kind == PipelineAction::kForward) {
          ready = a.stage == 0 || rk.activation_in.count(key);
        } else if (a.kind == PipelineAction::kBackward) {
          ready = rk.forward_done.count(key) && (a.stage == last || rk.gradient_in.count(key));
        }
        if (ready) {
          if (a.kind == PipelineAction::kForward) {
            rk.forward_done.insert(key);
            // The next stage on this same rank finds its input in memory.
            if (a.stage < last && (a.stage + 1) % pp == r)
              rk.activation_in.insert({a.stage + 1, a.micro_batch});
            in_flight_peak = std::max(in_flight_peak, ++in_flight[r]);
          } else {
            rk.backward_done.insert(key);
            if (a.stage > 0 && (a.stage - 1) % pp == r)
              rk.gradient_in.insert({a.stage - 1, a.micro_batch});
            --in_flight[r];
          }
          rk.busy_until = t + 1;
          ++rk.busy;
          ++rk.next;
          any_progress = true;
        }
      }
      if (rk.busy_until > t) busy = true;
      if (rk.next < per_rank[r].size()) done = false;
    }
    if (done && !busy) {
      stats.time_steps = t;
      break;
    }
    if (!any_progress && !busy) {
      std::ostringstream message;
      message << "pipeline simulation: deadlock at time " << t << ":";
      const char* sep = " ";
      for (int64_t r = 0; r < pp; ++r) {
        if (ranks[r].next >= per_rank[r].size()) continue;
        const PipelineAction& a = per_rank[r][ranks[r].next];
        message << sep << where(r, a)
                << (is_compute(a.kind) ? " waits for its input" : " waits for the send");
        sep = "; ";
      }
      message << " (reorder the actions so every recv's send comes first)";
      throw Error(message.str());
    }
  }
  for (const auto& [channel, pending] : channels) {
    if (!pending.empty()) {
      throw Error("pipeline simulation: rank " + std::to_string(std::get<0>(channel)) + " sent " +
                  (std::get<2>(channel) ? "the gradient" : "the activation") + " of stage " +
                  std::to_string(pending.front().first) + " mb " +
                  std::to_string(pending.front().second) + " that rank " +
                  std::to_string(std::get<1>(channel)) + " never receives; add the recv");
    }
  }
  double idle = 0;
  for (const Rank& rk : ranks) {
    stats.busy_steps_per_rank = std::max(stats.busy_steps_per_rank, rk.busy);
    if (stats.time_steps > 0) {
      idle +=
          static_cast<double>(stats.time_steps - rk.busy) / static_cast<double>(stats.time_steps);
    }
  }
  stats.bubble_fraction = idle / static_cast<double>(pp);
  stats.peak_in_flight = in_flight_peak;
  return stats;
}

}  // namespace fabric::distributed
