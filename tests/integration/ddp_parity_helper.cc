// Test helper for ddp_test: a self-launched DDP job that trains an MLP for STEPS SGD-momentum steps
// and, on rank 0, compares the parameters with one process trained on the concatenated batches.
//   ddp_parity_helper WORLD STEPS MODE
// MODE: plain    many small buckets
//       nosync   every step is two micro-batches, the first inside no_backward_sync; also checks
//                that the unsynced backward issued no collective (Gloo's sequence number)
//       allnosync  both micro-batches inside no_backward_sync: sync_unsynced_gradients (what
//                Fabric::step calls first) averages them (the same parameters as nosync's)
//       unused   the model has a layer forward never uses; find_unused_parameters must not hang
//                and the unused layer must stay untouched
//       static   static_graph
//       bf16     comm_hook bf16 (gradients on the wire in bfloat16: tolerance 2e-2, not 1e-6)
// "flat_" before plain, nosync, bf16 or unused turns on the capturable gradient sync
// (Ddp::set_capturable_gradient_sync, strategies/flat_gradient_sync.h): gradients all-reduced
// after backward instead of by the Reducer. flat_unused must fail: it prints "error: ..." and
// exits 3.
// A 4th argument "cuda_gloo" (GPU test) puts every rank on cuda:0 with Gloo for CUDA tensors and
// compares with the CPU reference (tolerance 1e-5); it exits 77 when no GPU is usable. A 4th
// argument "gloo" sets fabric.ddp.cpu_backend gloo (default auto: shared memory on one host).
// FABRIC_TEST_KILL_RANK=R (launcher tests): rank R kills itself at step 1 of torchrun's first
// attempt. Prints "max_rel_diff=X" and "params_hash=H" (FNV-1a of the trained parameters' bytes)
// and exits 0 when X is within tolerance and every check passed.
#include <torch/csrc/autograd/variable.h>
#include <torch/cuda.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "fabric/core/error.h"
#include "fabric/core/hash.h"
#include "fabric/environments/environments.h"
#include "strategies/ddp.h"

namespace {

constexpr int64_t kGlobalBatch = 12;  // divisible by 1, 2, 3, 4

// Linear → Tanh → Linear, plus (mode unused) a Linear that forward skips.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(bool with_unused) {
    torch::manual_seed(0);
    body =
        register_module("body", torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                                                      torch::nn::Linear(16, 4)));
    if (with_unused) unused = register_module("unused", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return body->forward(x); }
  torch::nn::Sequential body{nullptr};
  torch::nn::Linear unused{nullptr};
};
TORCH_MODULE(Net);

Net make_model(bool with_unused = false) { return Net(with_unused); }

std::pair<torch::Tensor, torch::Tensor> global_batch(int64_t step, int64_t micro) {
  torch::manual_seed(1000 + step * 10 + micro);
  return {torch::randn({kGlobalBatch, 8}), torch::randn({kGlobalBatch, 4})};
}

std::vector<torch::Tensor> reference(int64_t steps, int64_t micro_batches) {
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int64_t s = 0; s < steps; ++s) {
    opt.zero_grad();
    for (int64_t m = 0; m < micro_batches; ++m) {
      auto [x, y] = global_batch(s, m);
      torch::mse_loss(model->forward(x), y).backward();
    }
    opt.step();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : model->body->parameters()) out.push_back(p.detach().clone());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) return 2;
  const bool on_gpu = argc == 5 && std::string(argv[4]) == "cuda_gloo";
  if (on_gpu && !torch::cuda::is_available()) return 77;
  const torch::Device device = on_gpu ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
  const int64_t world = std::atoll(argv[1]);
  const int64_t steps = std::atoll(argv[2]);
  std::string mode = argv[3];
  const bool flat = mode.rfind("flat_", 0) == 0;
  if (flat) mode = mode.substr(5);
  const bool all_unsynced = mode == "allnosync";
  const bool nosync = mode == "nosync" || all_unsynced;
  auto env = std::shared_ptr<fabric::ClusterEnvironment>(
      fabric::detect_environment(fabric::process_environment(), world));
  fabric::strategies::DdpOptions options;
  options.timeout = std::chrono::seconds(30);
  options.bucket_cap_mb = 0.0005;  // ~500 bytes: many buckets
  options.find_unused_parameters = mode == "unused";
  options.static_graph = mode == "static";
  if (mode == "bf16") options.comm_hook = fabric::strategies::CommHook::kBf16;
  options.cuda_with_gloo = on_gpu;
  if (argc == 5 && std::string(argv[4]) == "gloo")
    options.cpu_backend = fabric::distributed::CpuBackend::kGloo;
  // Not bitwise: the reference takes the mean loss over the 12 samples of a step in one sum,
  // ddp the mean over each rank's share and then the mean of those (the Reducer's ×1/N and the
  // all-reduce): a few float32 ulps (2^-23 = 1.2e-7) per gradient and step, which 4 to 8 SGD
  // steps at lr 0.1 carry as is: 1e-6 (~8 ulps). On a GPU the matmuls reduce in other orders
  // than the CPU reference's (1e-5). bf16 wires round each gradient to 8 significant bits
  // (2^-8 = 3.9e-3): 2e-2 is ~5 such roundings.
  const double tolerance = mode == "bf16" ? 2e-2 : on_gpu ? 1e-5 : 1e-6;
  fabric::strategies::Ddp ddp(
      env, device,
      std::make_unique<fabric::Precision>(fabric::PrecisionMode::k32True, device.type()), options,
      std::vector<std::string>(argv, argv + argc));
  ddp.setup_environment();
  const int64_t rank = ddp.global_rank();
  int failures = 0;

  auto model = make_model(mode == "unused");
  if (rank != 0) {  // different initial values: setup_module must broadcast rank 0's
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(1.0);
  }
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  ddp.setup_module(*model);
  ddp.set_capturable_gradient_sync(flat);
  // Capturable: nothing may keep the parameters' AccumulateGrad nodes alive between steps (the
  // Reducer did: on a GPU a captured backward then made the default stream wait on the capture).
  for (const auto& p : model->parameters()) {
    if (flat && torch::autograd::impl::try_get_grad_accumulator(p) != nullptr) {
      std::fprintf(stderr, "rank %lld: a gradient accumulator outlives the capturable switch\n",
                   static_cast<long long>(rank));
      ++failures;
      break;
    }
  }
  const int64_t local = kGlobalBatch / world;
  auto backend = ddp.process_group()->getDefaultBackend();
  // Launcher tests: FABRIC_TEST_KILL_RANK=R kills rank R (SIGKILL) at step 1 of torchrun's first
  // attempt (TORCHELASTIC_RESTART_COUNT unset or 0).
  const char* kill_rank = std::getenv("FABRIC_TEST_KILL_RANK");
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const bool die = kill_rank != nullptr && std::atoll(kill_rank) == rank &&
                   (attempt == nullptr || std::atoll(attempt) == 0);
  try {
    for (int64_t s = 0; s < steps; ++s) {
      if (die && s == 1) raise(SIGKILL);
      opt.zero_grad();
      for (int64_t m = 0; m < (nosync ? 2 : 1); ++m) {
        auto [x, y] = global_batch(s, m);
        auto loss = torch::mse_loss(model->forward(x.narrow(0, rank * local, local).to(device)),
                                    y.narrow(0, rank * local, local).to(device));
        if (nosync && (m == 0 || all_unsynced)) {
          const uint64_t before = backend->getSequenceNumberForGroup();
          auto guard = ddp.no_backward_sync();
          ddp.backward(loss);
          if (backend->getSequenceNumberForGroup() != before) {
            std::fprintf(stderr, "rank %lld: collective issued inside no_backward_sync\n",
                         static_cast<long long>(rank));
            ++failures;
          }
        } else {
          ddp.backward(loss);
        }
      }
      ddp.sync_unsynced_gradients();  // as Fabric::step does; nothing after a synced backward
      ddp.optimizer_step(opt);
    }
  } catch (const fabric::Error& e) {
    std::printf("error: %s\n", e.what());
    std::fflush(stdout);
    ddp.teardown_after_error();
    return 3;
  }
  if (ddp.synced_backward_passes() != steps) ++failures;

  double max_rel = 0;
  if (rank == 0) {
    const auto ref = reference(steps, nosync ? 2 : 1);
    const auto params = model->body->parameters();
    for (size_t i = 0; i < ref.size(); ++i) {
      const double rel =
          ((params[i].detach().cpu() - ref[i]).abs().max() / ref[i].abs().max().clamp_min(1e-12))
              .item<double>();
      max_rel = std::max(max_rel, rel);
    }
    std::printf("max_rel_diff=%g\n", max_rel);
    // The exact bits of the trained parameters: equal across process layouts (netns_test).
    uint64_t hash = fabric::fnv1a64({});
    for (const auto& p : params) {
      const auto t = p.detach().cpu().contiguous();
      hash = fabric::fnv1a64(
          std::string_view(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.nbytes())),
          hash);
    }
    std::printf("params_hash=%016llx\n", static_cast<unsigned long long>(hash));
    if (!(max_rel <= tolerance)) ++failures;
    if (mode == "unused") {
      const auto untouched = make_model(true);
      for (const auto& p : model->unused->named_parameters()) {
        if (!torch::equal(p.value().cpu(), untouched->unused->named_parameters()[p.key()])) {
          std::fprintf(stderr, "unused parameter %s changed\n", p.key().c_str());
          ++failures;
        }
      }
    }
  }
  ddp.teardown();
  return failures == 0 ? 0 : 1;
}
