#include "fabric/distributed/pipeline_runtime.h"

#include <torch/autograd.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <utility>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"

#ifdef FABRIC_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace fabric::distributed {

namespace {

std::string sizes_text(at::IntArrayRef sizes, c10::ScalarType dtype) {
  std::ostringstream s;
  s << sizes << " " << c10::toString(dtype);
  return s.str();
}

// What one (stage, micro-batch) holds between its forward and its backward.
struct Slot {
  at::Tensor input;       // requires grad (stages after the first)
  at::Tensor output;      // the forward's output (every stage but the last)
  at::Tensor loss;        // the last stage's
  at::Tensor grad_in;     // the gradient of `output`, received
  at::Tensor input_grad;  // the gradient of `input`, after backward (until sent or used)
};

constexpr int kSumBetweenTag = 1 << 30;

bool is_compute(const PipelineAction& a) {
  return a.kind == PipelineAction::kForward || a.kind == PipelineAction::kBackward;
}

}  // namespace

PipelineRunner::PipelineRunner(c10::intrusive_ptr<c10d::ProcessGroup> group,
                               PipelineOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  if (group_) {
    rank_ = group_->getRank();
    pp_ = group_->getSize();
    // Gloo's send/recv reads and writes host memory: CUDA tensors go through the host when
    // several ranks share one GPU (on an H200 on 2026-11-30 a device pointer failed Gloo's
    // writev with "Bad address").
    host_wire_ = sends_through_host(*group_, options_.device);
  }
  actions_ = pipeline_actions(options_.schedule, rank_, pp_, options_.micro_batches,
                              options_.virtual_stages);
  // Evaluation: each local stage in model order over every micro-batch (GPipe's forward half per
  // stage). A recv waits only on a lower stage, which its rank runs first: no cycle, no deadlock.
  const int64_t last = stages() - 1;
  for (int64_t k : local_stages()) {
    for (int64_t mb = 0; mb < options_.micro_batches; ++mb) {
      if (k > 0 && !holds(k - 1))
        forward_actions_.push_back({PipelineAction::kRecvActivation, mb, k, (k - 1) % pp_});
      forward_actions_.push_back({PipelineAction::kForward, mb, k, -1});
      if (k < last && !holds(k + 1))
        forward_actions_.push_back({PipelineAction::kSendActivation, mb, k, (k + 1) % pp_});
    }
  }
  if (stages() > 1 && options_.activation_sizes.empty())
    throw Error("pipeline: PipelineOptions::activation_sizes is empty; a pipeline of " +
                std::to_string(stages()) +
                " stages needs the shape of one micro-batch's activation between two stages");
  const int64_t tags = 2 * stages() * options_.micro_batches;
  if (tags >= kSumBetweenTag)
    throw Error("pipeline: " + std::to_string(stages()) + " stages x " +
                std::to_string(options_.micro_batches) +
                " micro-batches need more message tags than c10d has; use fewer micro-batches");
}

PipelineRunner::~PipelineRunner() = default;

std::vector<int64_t> PipelineRunner::local_stages() const {
  std::vector<int64_t> out;
  for (int64_t k = rank_; k < stages(); k += pp_) out.push_back(k);
  return out;
}

at::Tensor PipelineRunner::step(const PipelineStageCalls& calls) {
  return run(actions_, calls, /*train=*/true);
}

at::Tensor PipelineRunner::evaluate(const PipelineStageCalls& calls) {
  torch::NoGradGuard no_grad;
  return run(forward_actions_, calls, /*train=*/false);
}

at::Tensor PipelineRunner::run(const std::vector<PipelineAction>& actions,
                               const PipelineStageCalls& calls, bool train) {
  using Clock = std::chrono::steady_clock;
  // The timeline's clock. On CUDA it first waits for the work queued on the current stream, so
  // an event spans its kernels, not their launches, and the step starts with none queued
  // (PipelineOptions::record_timeline).
  const bool sync_clock = options_.record_timeline && options_.device.is_cuda();
  auto settle = [sync_clock, this] {
    if (!sync_clock) return;
#ifdef FABRIC_WITH_CUDA
    c10::cuda::getCurrentCUDAStream(options_.device.has_index() ? options_.device.index() : -1)
        .synchronize();
#endif
  };
  settle();
  const auto t0 = Clock::now();
  const int64_t m = options_.micro_batches, last = stages() - 1;
  auto seconds = [&t0, &settle] {
    settle();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  // Tag of the activation stage k sends to k + 1 (gradient = false), or of the gradient of that
  // activation, sent back from k + 1 to k (gradient = true).
  auto tag = [&](bool gradient, int64_t stage, int64_t mb) {
    return static_cast<int>(((gradient ? 1 : 0) * stages() + stage) * m + mb);
  };
  std::map<std::pair<int64_t, int64_t>, Slot> slots;
  struct Pending {
    std::vector<at::Tensor> tensors;
    c10::intrusive_ptr<c10d::Work> work;
    std::string what;
  };
  std::vector<Pending> sends;
  const auto buffer_options =
      at::TensorOptions().dtype(options_.activation_dtype).device(options_.device);
  at::Tensor loss_sum =
      torch::zeros({}, at::TensorOptions().dtype(at::kFloat).device(options_.device));
  int64_t in_flight = 0;
  if (train) peak_in_flight_ = 0;
  timeline_.clear();

  auto send = [&](at::Tensor t, int64_t peer, int tag_value, const PipelineAction& a) {
    Pending p{{wire_tensor(t, host_wire_)}, {}, to_string(a)};
    p.work = group_->send(p.tensors, static_cast<int>(peer), tag_value);
    sends.push_back(std::move(p));
  };
  // Recvs by action index: posted when reached, or (recv_ahead) as soon as the compute before
  // them starts, so the transfer overlaps that compute.
  std::map<size_t, Pending> posted;
  auto is_recv = [](const PipelineAction& a) {
    return a.kind == PipelineAction::kRecvActivation || a.kind == PipelineAction::kRecvGradient;
  };
  auto post = [&](size_t i) {
    const PipelineAction& a = actions[i];
    if (posted.count(i) > 0) return;
    const int tag_value = a.kind == PipelineAction::kRecvActivation
                              ? tag(false, a.stage - 1, a.micro_batch)
                              : tag(true, a.stage, a.micro_batch);
    Pending p{{at::empty(options_.activation_sizes,
                         host_wire_ ? buffer_options.device(at::kCPU) : buffer_options)},
              {},
              to_string(a)};
    p.work = group_->recv(p.tensors, static_cast<int>(a.peer_rank), tag_value);
    posted.emplace(i, std::move(p));
  };
  auto recv = [&](size_t i) {
    post(i);
    auto it = posted.find(i);
    wait(it->second.work, "pipeline " + it->second.what);
    at::Tensor t = it->second.tensors[0];
    posted.erase(it);
    return host_wire_ ? t.to(options_.device) : t;
  };

  // Sends that completed release their tensors (an activation whose backward ran would otherwise
  // live until the step's end); a failed one reports here.
  auto reap = [&] {
    auto done = std::remove_if(sends.begin(), sends.end(), [](Pending& p) {
      if (!p.work->isCompleted()) return false;
      wait(p.work, "pipeline " + p.what);
      return true;
    });
    sends.erase(done, sends.end());
  };

  for (size_t i = 0; i < actions.size(); ++i) {
    const PipelineAction& a = actions[i];
    const int64_t k = a.stage, mb = a.micro_batch;
    if (is_compute(a)) reap();
    if (options_.recv_ahead && is_compute(a)) {
      for (size_t j = i + 1; j < actions.size(); ++j) {
        if (is_recv(actions[j])) {
          post(j);
          break;
        }
      }
    }
    switch (a.kind) {
      case PipelineAction::kRecvActivation:
        slots[{k, mb}].input = recv(i);
        break;
      case PipelineAction::kRecvGradient:
        slots[{k, mb}].grad_in = recv(i);
        break;
      case PipelineAction::kSendActivation:
        send(slots.at({k, mb}).output.detach(), a.peer_rank, tag(false, k, mb), a);
        if (!train) slots.erase({k, mb});  // no backward to keep it for
        break;
      case PipelineAction::kSendGradient: {
        auto it = slots.find({k, mb});
        send(it->second.input_grad, a.peer_rank, tag(true, k - 1, mb), a);
        slots.erase(it);
        break;
      }
      case PipelineAction::kForward: {
        PipelineEvent event{true, k, mb, seconds(), 0};
        Slot& s = slots[{k, mb}];
        if (k > 0) {
          // From the previous stage: received, or its output here (same rank) cut from its graph.
          at::Tensor in = holds(k - 1) ? slots.at({k - 1, mb}).output.detach() : s.input;
          s.input = train ? in.requires_grad_(true) : in;
          if (!train && holds(k - 1)) slots.erase({k - 1, mb});
        }
        at::Tensor out = calls.forward(k, mb, s.input);  // (std::map: `s` outlives other erases)
        if (k == last) {
          s.loss = calls.loss(mb, out);
          loss_sum += s.loss.detach().to(at::kFloat);
          if (!train) slots.erase({k, mb});
        } else {
          if (!out.defined() || out.sizes() != at::IntArrayRef(options_.activation_sizes) ||
              out.scalar_type() != options_.activation_dtype)
            throw Error("pipeline: stage " + std::to_string(k) + "'s forward of micro-batch " +
                        std::to_string(mb) + " returned " +
                        (out.defined() ? sizes_text(out.sizes(), out.scalar_type())
                                       : std::string("no tensor")) +
                        "; the next stage expects " +
                        sizes_text(options_.activation_sizes, options_.activation_dtype) +
                        " (PipelineOptions::activation_sizes and activation_dtype)");
          s.output = out;
        }
        if (train) peak_in_flight_ = std::max(peak_in_flight_, ++in_flight);
        if (options_.record_timeline) {
          event.end = seconds();
          timeline_.push_back(event);
        }
        break;
      }
      case PipelineAction::kBackward: {
        PipelineEvent event{false, k, mb, seconds(), 0};
        Slot& s = slots.at({k, mb});
        if (k == last) {
          const at::Tensor scaled = s.loss / static_cast<double>(m);
          if (calls.backward) {
            calls.backward(scaled);
          } else {
            scaled.backward();
          }
        } else {
          at::Tensor grad = s.grad_in;
          if (holds(k + 1)) {  // the next stage ran here: its input's gradient, in memory
            auto next = slots.find({k + 1, mb});
            grad = next->second.input_grad;
            slots.erase(next);
          }
          torch::autograd::backward({s.output}, {grad});
        }
        if (k > 0) {
          const at::Tensor g = s.input.grad();
          s.input_grad = g.defined() ? g : at::zeros_like(s.input);
        }
        s.input = at::Tensor();
        s.output = at::Tensor();
        s.loss = at::Tensor();
        s.grad_in = at::Tensor();
        --in_flight;
        if (k == 0) slots.erase({k, mb});
        if (options_.record_timeline) {
          event.end = seconds();
          timeline_.push_back(event);
        }
        break;
      }
    }
  }
  for (Pending& p : sends) wait(p.work, "pipeline " + p.what);
  at::Tensor mean = loss_sum / static_cast<double>(m);
  if (pp_ > 1) {
    std::vector<at::Tensor> t = {mean};
    c10d::BroadcastOptions o;
    o.rootRank = static_cast<int>(last % pp_);
    wait(group_->broadcast(t, o), "pipeline loss broadcast");
    mean = t[0];
  }
  return mean;
}

at::Tensor PipelineRunner::clip_grad_norm(const std::vector<at::Tensor>& parameters,
                                          double max_norm, const std::vector<at::Tensor>& shared) {
  std::vector<at::Tensor> grads, norms;
  for (const at::Tensor& p : parameters) {
    if (!p.grad().defined()) continue;
    grads.push_back(p.grad());
    const bool counted_elsewhere =
        !holds_first() && std::any_of(shared.begin(), shared.end(),
                                      [&](const at::Tensor& s) { return s.is_same(p); });
    if (!counted_elsewhere) norms.push_back(at::linalg_vector_norm(p.grad().to(at::kFloat), 2));
  }
  at::Tensor squares =
      norms.empty() ? at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(options_.device))
                    : at::stack(norms).pow(2).sum();
  if (pp_ > 1) {
    std::vector<at::Tensor> t = {squares};
    wait(group_->allreduce(t), "pipeline clip_grad_norm all_reduce");
    squares = t[0];
  }
  const at::Tensor total = squares.sqrt();
  const at::Tensor coefficient = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (at::Tensor& g : grads) g.mul_(coefficient.to(g.dtype()));
  return total;
}

void PipelineRunner::sum_between(at::Tensor& t, int64_t a, int64_t b) {
  if (a == b || pp_ == 1 || (rank_ != a && rank_ != b)) return;
  std::vector<at::Tensor> mine = {wire_tensor(t, host_wire_)};
  if (rank_ == b) {
    wait(group_->send(mine, static_cast<int>(a), kSumBetweenTag), "pipeline sum_between send");
    wait(group_->recv(mine, static_cast<int>(a), kSumBetweenTag), "pipeline sum_between recv");
  } else {
    std::vector<at::Tensor> theirs = {at::empty_like(mine[0])};  // on mine's device
    wait(group_->recv(theirs, static_cast<int>(b), kSumBetweenTag), "pipeline sum_between recv");
    mine[0].add_(theirs[0]);
    wait(group_->send(mine, static_cast<int>(b), kSumBetweenTag), "pipeline sum_between send");
  }
  if (!mine[0].is_same(t)) t.copy_(mine[0]);
}

std::vector<at::Tensor> split_micro_batches(const at::Tensor& batch, int64_t micro_batches) {
  const int64_t rows = batch.dim() > 0 ? batch.size(0) : 0;
  if (micro_batches >= 1 && rows >= micro_batches && rows % micro_batches == 0)
    return batch.chunk(micro_batches, 0);
  std::string divisors;
  for (int64_t d = 1; d <= rows; ++d)
    if (rows % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
  const std::string m = std::to_string(micro_batches);
  throw Error("a batch of " + std::to_string(rows) + " rows does not split into " + m +
              " equal micro-batches (fabric.pipeline.micro_batches); use a batch size that is a "
              "multiple of " +
              m + " (" + m + ", " + std::to_string(2 * std::max<int64_t>(micro_batches, 1)) +
              ", ...), or micro_batches that divides " + std::to_string(rows) + " (" +
              (divisors.empty() ? "none" : divisors) + ")");
}

double bubble_fraction(const std::vector<PipelineEvent>& timeline, double makespan) {
  if (timeline.empty()) return 0;
  double busy = 0, end = 0;
  for (const PipelineEvent& e : timeline) {
    busy += e.end - e.start;
    end = std::max(end, e.end);
  }
  const double span = makespan > 0 ? makespan : end;
  return span > 0 ? 1.0 - busy / span : 0;
}

}  // namespace fabric::distributed
