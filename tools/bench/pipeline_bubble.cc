// The pipeline schedules' bubble and activation memory, measured against theory (issue 71): a
// self-launched job of --pp processes trains a GPT cut into stages (GPTStages, PipelineRunner)
// under GPipe, 1F1B and interleaved 1F1B (2 virtual stages per rank) at each --micro_batches, and
// rank 0 prints one line per run:
//   schedule, m, v, the bubble fraction measured from the step's timeline (each rank's idle share
//   of the makespan from a common start after a barrier, averaged over the ranks; the median of
//   --steps steps), theory's (p-1)/(m+p-1), or (p-1)/(v*m+p-1) interleaved, the most activations
//   any rank held at once (PipelineRunner::peak_in_flight, micro-batch x stage units), and the
//   most tensor bytes any rank allocated during a step above what it held before it (gradients
//   are zeroed in place, allocated since the warm-up step; the counting CPU allocator,
//   fabric/accelerators/memory.h): the activations' memory.
//   bazel run -c opt //tools/bench:pipeline_bubble -- --pp=2 --micro_batches=8,16
// --recv_ahead=false posts each recv only when it is reached (the runner's default posts it one
// compute early).
// --device=cuda (default cpu): every rank on cuda:0 (model, micro-batches, activations; float32,
// no autocast), the ranks' CUDA tensors over Gloo (ranks sharing one GPU, as
// fabric.ddp.ranks_per_gpu does; the runner sends activations through host memory). The
// timeline then synchronizes the stream before each timestamp (PipelineOptions::record_timeline),
// which adds a host-device sync per compute to the step; activation_MiB is the CUDA caching
// allocator's peak (fabric::memory_stats on the device) over what the rank held before the step.
// The ranks time-slice the one GPU, so computes that overlap on two ranks each include the
// other's share: the bubble of a shared GPU, not of pp GPUs. Without a CUDA device it exits 1
// with one line. gpu_check.sh run --suite=model_parallel runs it (pp 2) on the node.
// --gantt=N prints each run's last step as text, one row per rank (forwards as the micro-batch's
// digit, backwards as a letter, idle as '.'). One intra-op thread per rank: run with --pp at most
// the CPUs, or the ranks share cores and the timeline measures the sharing, not the schedule.
#include <gflags/gflags.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#ifdef FABRIC_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fabric/accelerators/memory.h"
#include "fabric/distributed/pipeline_runtime.h"
#include "fabric/distributed/process_group.h"
#include "fabric/environments/environments.h"
#include "fabric/launchers/subprocess_launcher.h"
#include "fabric/models/gpt.h"
#include "fabric/models/pipeline_stages.h"

DEFINE_int32(pp, 2, "pipeline ranks (processes)");
DEFINE_string(micro_batches, "8,16", "micro-batch counts, comma-separated");
DEFINE_int32(micro_batch_size, 2, "sequences per micro-batch");
DEFINE_int32(seq, 128, "tokens per sequence");
DEFINE_int32(layers, 8, "GPT blocks (a multiple of 2 x pp)");
DEFINE_int32(width, 256, "GPT n_embd");
DEFINE_int32(steps, 5, "timed steps per run (after 1 warm-up)");
DEFINE_bool(recv_ahead, true, "PipelineOptions::recv_ahead: post each recv one compute early");
DEFINE_int32(gantt, 0, "print each run's last step as a text chart this many columns wide");
DEFINE_string(device, "cpu",
              "cpu | cuda: cuda puts every rank on cuda:0 (Gloo between them) and synchronizes "
              "the stream before each timeline timestamp");

namespace {

std::vector<int64_t> numbers(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream s(text);
  for (std::string item; std::getline(s, item, ',');) out.push_back(std::stoll(item));
  return out;
}

// Rank 0 prints every rank's timeline as a row of `--gantt` columns: a forward as its
// micro-batch's digit (mod 10), a backward as a letter (a = 0), idle as '.'.
void gantt(c10d::ProcessGroup& group, const std::vector<fabric::distributed::PipelineEvent>& events,
           double makespan, int64_t rank) {
  std::vector<torch::Tensor> counts = {torch::tensor({static_cast<int64_t>(events.size())})};
  fabric::distributed::wait(group.allreduce(counts, {c10d::ReduceOp::MAX}), "gantt count");
  const int64_t most = counts[0].item<int64_t>();
  torch::Tensor mine = torch::full({most, 4}, -1.0, torch::kDouble);  // forward, mb, start, end
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    mine[static_cast<int64_t>(i)] =
        torch::tensor({e.forward ? 1.0 : 0.0, static_cast<double>(e.micro_batch), e.start, e.end},
                      torch::kDouble);
  }
  const auto all = fabric::distributed::all_gather(group, mine, "gantt");
  if (rank != 0) return;
  const int width = FLAGS_gantt;
  for (size_t r = 0; r < all.size(); ++r) {
    std::string row(static_cast<size_t>(width), '.');
    for (int64_t i = 0; i < most; ++i) {
      const auto e = all[r][i];
      if (e[0].item<double>() < 0) continue;
      const int64_t mb = static_cast<int64_t>(e[1].item<double>());
      const char mark = e[0].item<double>() > 0 ? static_cast<char>('0' + mb % 10)
                                                : static_cast<char>('a' + mb % 26);
      const int from = static_cast<int>(e[2].item<double>() / makespan * width);
      const int to = std::max(from + 1, static_cast<int>(e[3].item<double>() / makespan * width));
      for (int c = from; c < std::min(to, width); ++c) row[static_cast<size_t>(c)] = mark;
    }
    std::printf("  rank %zu |%s|\n", r, row.c_str());
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The device --device names; empty with the reason in `why_not` when it cannot run here.
std::optional<torch::Device> chosen_device(std::string* why_not) {
  if (FLAGS_device == "cpu") return torch::Device(torch::kCPU);
  if (FLAGS_device != "cuda") {
    *why_not = "--device must be cpu or cuda, not '" + FLAGS_device + "'";
    return std::nullopt;
  }
#ifdef FABRIC_WITH_CUDA
  if (torch::cuda::is_available()) return torch::Device(torch::kCUDA, 0);
  *why_not =
      "--device=cuda, but no CUDA device is visible (torch::cuda::is_available() is false); "
      "run on a GPU node or use --device=cpu";
#else
  *why_not =
      "--device=cuda, but this build has no CUDA (--config=cpu_only or a CPU-only LibTorch); "
      "use --device=cpu";
#endif
  return std::nullopt;
}

// Waits for the work queued on the device (CUDA), so that what follows starts from an idle GPU.
void settle(const torch::Device& device) {
#ifdef FABRIC_WITH_CUDA
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv, argv + argc);  // for the other ranks, flags and all
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  std::string why_not;
  const std::optional<torch::Device> chosen = chosen_device(&why_not);
  if (!chosen) {
    std::fprintf(stderr, "pipeline_bubble: %s\n", why_not.c_str());
    return FLAGS_device == "cuda" ? 1 : 2;
  }
  const torch::Device device = *chosen;
  const int64_t pp = FLAGS_pp;
  auto env = fabric::detect_environment(fabric::process_environment(), pp);
  const int64_t rank = env->global_rank();
  const std::chrono::seconds timeout(300);
  c10::intrusive_ptr<c10d::Store> store;
  std::unique_ptr<fabric::SubprocessLauncher> launcher;
  if (rank == 0) {
    store = fabric::distributed::make_store({"127.0.0.1", 0, true, pp, timeout, "127.0.0.1", ""});
    fabric::LaunchOptions launch;
    launch.world_size = pp;
    launch.master_port = fabric::distributed::store_port(store);
    launcher = std::make_unique<fabric::SubprocessLauncher>(launch, args);
  } else {
    store = fabric::distributed::make_store(
        {"127.0.0.1", env->main_port(), false, pp, timeout, "127.0.0.1", ""});
  }
  torch::set_num_threads(1);
  fabric::distributed::ProcessGroupOptions group_options;
  group_options.rank = rank;
  group_options.world_size = pp;
  group_options.timeout = timeout;
  // CUDA: all ranks on cuda:0, so their CUDA tensors (the loss broadcast) go over Gloo.
  group_options.cuda = device.is_cuda();
  group_options.cuda_with_gloo = device.is_cuda();
  auto group = fabric::distributed::make_process_group(store, group_options);
  fabric::memory_stats(device);  // CPU: installs the counting allocator

  fabric::models::GPTConfig c = fabric::models::GPTConfig::preset("tiny");
  c.n_layer = FLAGS_layers;
  c.n_embd = FLAGS_width;
  c.block_size = FLAGS_seq;
  struct Run {
    std::string schedule;
    int64_t v;
  };
  if (rank == 0)
    std::printf(
        "pp=%lld, %d blocks of width %d, micro-batches of %d x %d tokens%s\n%-17s %4s %2s %9s "
        "%9s %9s %13s\n",
        static_cast<long long>(pp), FLAGS_layers, FLAGS_width, FLAGS_micro_batch_size, FLAGS_seq,
        device.is_cuda() ? ", every rank on cuda:0 (Gloo), float32, synchronized timestamps" : "",
        "schedule", "m", "v", "bubble", "theory", "in_flight", "activation_MiB");
  for (const int64_t m : numbers(FLAGS_micro_batches)) {
    for (const Run& run : {Run{"gpipe", 1}, Run{"1f1b", 1}, Run{"interleaved_1f1b", 2}}) {
      fabric::distributed::PipelineOptions o;
      o.schedule = fabric::distributed::parse_pipeline_schedule(run.schedule);
      o.micro_batches = m;
      o.virtual_stages = run.v;
      o.activation_sizes = {FLAGS_micro_batch_size, FLAGS_seq, FLAGS_width};
      o.device = device;
      o.record_timeline = true;
      o.recv_ahead = FLAGS_recv_ahead;
      fabric::distributed::PipelineRunner runner(group, o);
      torch::manual_seed(1);
      fabric::models::GPT whole(c);
      fabric::models::GPTStages mine(whole, runner.local_stages(), runner.stages());
      whole = fabric::models::GPT(nullptr);
      if (device.is_cuda()) mine->to(device);
      std::vector<torch::Tensor> tokens, targets;
      for (int64_t i = 0; i < m; ++i) {
        torch::Tensor b = torch::randint(0, 256, {FLAGS_micro_batch_size, FLAGS_seq + 1});
        if (device.is_cuda()) b = b.to(device);
        tokens.push_back(b.narrow(1, 0, FLAGS_seq));
        targets.push_back(b.narrow(1, 1, FLAGS_seq));
      }
      fabric::distributed::PipelineStageCalls calls;
      calls.forward = [&](int64_t k, int64_t mb, const torch::Tensor& in) {
        return mine->forward(k, k == 0 ? tokens[static_cast<size_t>(mb)] : in);
      };
      calls.loss = [&](int64_t mb, const torch::Tensor& out) {
        return mine->loss(out, targets[static_cast<size_t>(mb)]);
      };
      std::vector<double> bubbles;
      double activation_bytes = 0;
      for (int step = 0; step <= FLAGS_steps; ++step) {
        for (auto& p : mine->parameters())
          if (p.grad().defined()) p.mutable_grad().zero_();
        // Gradients exist after the warm-up step: the memory above this is the step's own.
        const int64_t before = fabric::memory_stats(device).allocated;
        fabric::reset_peak_memory(device);
        settle(device);  // the zeroing done before the common start
        group->barrier()->wait();
        runner.step(calls);
        const double peak = static_cast<double>(fabric::memory_stats(device).peak - before);
        double end = 0, busy = 0;
        for (const auto& e : runner.timeline()) {
          end = std::max(end, e.end);
          busy += e.end - e.start;
        }
        // [makespan, peak bytes] maxed over the ranks, busy summed.
        std::vector<torch::Tensor> most = {torch::tensor({end, peak}, torch::kDouble)};
        fabric::distributed::wait(group->allreduce(most, {c10d::ReduceOp::MAX}), "max");
        std::vector<torch::Tensor> sum = {torch::tensor({busy}, torch::kDouble)};
        fabric::distributed::wait(group->allreduce(sum), "sum");
        if (step == 0) continue;  // warm-up
        const double makespan = most[0][0].item<double>();
        bubbles.push_back(1.0 - sum[0][0].item<double>() / static_cast<double>(pp) / makespan);
        activation_bytes = std::max(activation_bytes, most[0][1].item<double>());
        if (FLAGS_gantt > 0 && step == FLAGS_steps)
          gantt(*group, runner.timeline(), makespan, rank);
      }
      std::vector<torch::Tensor> in_flight = {torch::tensor({runner.peak_in_flight()})};
      fabric::distributed::wait(group->allreduce(in_flight, {c10d::ReduceOp::MAX}), "max");
      const double p = static_cast<double>(pp), vm = static_cast<double>(run.v * m);
      if (rank == 0)
        std::printf("%-17s %4lld %2lld %9.3f %9.3f %9lld %13.1f\n", run.schedule.c_str(),
                    static_cast<long long>(m), static_cast<long long>(run.v), median(bubbles),
                    (p - 1) / (vm + p - 1), static_cast<long long>(in_flight[0].item<int64_t>()),
                    activation_bytes / (1 << 20));
      std::fflush(stdout);
    }
  }
  group->barrier()->wait();
  return launcher ? launcher->wait() : 0;
}
