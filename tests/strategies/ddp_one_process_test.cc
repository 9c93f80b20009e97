// strategies::Ddp (and ParallelStrategy under it) in one process, world size 1: the rendezvous
// (a real store on an ephemeral loopback port and a real process group), collectives with their
// mean and integer rules, errors before launch and for a missing source rank, and the typed
// options the Connector parses. Multi-process behaviour: tests/integration/ddp_test.cc.
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <optional>
#include <string>

#include "fabric/core/error.h"
#include "fabric/environments/environments.h"
#include "strategies/ddp.h"
#include "strategies/ddp_options.h"

namespace {

using fabric::ReduceOp;
using fabric::distributed::CpuBackend;
using fabric::strategies::CommHook;

std::unique_ptr<fabric::strategies::Ddp> one_process_ddp() {
  auto env = fabric::detect_environment(
      [](const std::string&) -> std::optional<std::string> { return std::nullopt; }, 1);
  fabric::strategies::DdpOptions options;
  options.timeout = std::chrono::seconds(30);
  return std::make_unique<fabric::strategies::Ddp>(
      std::shared_ptr<fabric::ClusterEnvironment>(std::move(env)), torch::kCPU,
      std::make_unique<fabric::Precision>(fabric::PrecisionMode::k32True, c10::DeviceType::CPU),
      options, std::vector<std::string>{});
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const fabric::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DdpOneProcessTest, CollectivesBeforeLaunchAreErrorsNotCrashes) {
  auto ddp = one_process_ddp();
  EXPECT_EQ(ddp->process_group(), nullptr);
  EXPECT_EQ(error_of([&] { ddp->all_reduce(torch::ones(2), ReduceOp::kSum); }),
            "ddp: all_reduce(sum) before launch (call it inside Fabric::launch)");
  EXPECT_EQ(error_of([&] { ddp->barrier(); }),
            "ddp: barrier before launch (call it inside Fabric::launch)");
  torch::nn::Linear model(2, 2);
  EXPECT_EQ(error_of([&] { ddp->setup_module(*model); }),
            "ddp: setup_module before launch (call it inside Fabric::launch)");
}

TEST(DdpOneProcessTest, RendezvousAndCollectivesOfAWorldOfOne) {
  auto ddp = one_process_ddp();
  EXPECT_EQ(ddp->name(), "ddp");
  ddp->setup_environment();
  ASSERT_NE(ddp->process_group(), nullptr);
  EXPECT_EQ(ddp->world_size(), 1);
  const auto x = torch::tensor({2.0, -4.0});
  EXPECT_TRUE(torch::equal(ddp->all_reduce(x, ReduceOp::kSum), x));
  EXPECT_TRUE(torch::equal(ddp->all_reduce(x, ReduceOp::kMean), x));
  // Integer means divide with floor, keeping the dtype.
  const auto ints = torch::tensor({7, -7});
  const auto mean = ddp->all_reduce(ints, ReduceOp::kMean);
  EXPECT_EQ(mean.scalar_type(), torch::kLong);
  EXPECT_TRUE(torch::equal(mean, ints));
  // The input is not changed in place.
  auto y = torch::tensor({1.0});
  ddp->all_reduce(y, ReduceOp::kSum).add_(1);
  EXPECT_EQ(y.item<double>(), 1.0);
  EXPECT_TRUE(torch::equal(ddp->broadcast(x, 0), x));
  EXPECT_EQ(error_of([&] { ddp->broadcast(x, 1); }),
            "broadcast: src 1 does not exist (world size 1)");
  ASSERT_EQ(ddp->all_gather(x).size(), 1u);
  ddp->barrier();

  torch::nn::Linear model(3, 1);
  ddp->setup_module(*model);
  auto loss = model->forward(torch::ones({2, 3})).sum();
  ddp->backward(loss);
  EXPECT_EQ(ddp->synced_backward_passes(), 1);
  EXPECT_TRUE(torch::allclose(model->weight.grad(), torch::full({1, 3}, 2.0)));
  // After backward passes that all ran inside no_backward_sync, sync_unsynced_gradients (which
  // Fabric::step calls) synchronizes them; after a synchronized one it does nothing.
  torch::optim::SGD sgd(model->parameters(), 0.1);
  {
    auto guard = ddp->no_backward_sync();
    ddp->backward(model->forward(torch::ones({2, 3})).sum());
  }
  EXPECT_EQ(ddp->synced_backward_passes(), 1);
  ddp->sync_unsynced_gradients();
  ddp->optimizer_step(sgd);
  EXPECT_EQ(ddp->synced_backward_passes(), 2);
  ddp->backward(model->forward(torch::ones({2, 3})).sum());
  ddp->sync_unsynced_gradients();
  ddp->optimizer_step(sgd);
  EXPECT_EQ(ddp->synced_backward_passes(), 3);
  // A second module gets a Reducer of its own: a backward through both synchronizes both, one
  // through the second only leaves the first's gradients as they were. A frozen module is taken
  // and never synchronized.
  torch::nn::Linear other(3, 1);
  ddp->setup_module(*other);
  torch::nn::Linear frozen(3, 1);
  for (auto& p : frozen->parameters()) p.requires_grad_(false);
  ddp->setup_module(*frozen);
  model->zero_grad();
  ddp->backward((model->forward(torch::ones({2, 3})) + other->forward(torch::ones({2, 3})) +
                 frozen->forward(torch::ones({2, 3})))
                    .sum());
  EXPECT_EQ(ddp->synced_backward_passes(), 4);
  EXPECT_TRUE(torch::allclose(model->weight.grad(), torch::full({1, 3}, 2.0)));
  EXPECT_TRUE(torch::allclose(other->weight.grad(), torch::full({1, 3}, 2.0)));
  EXPECT_FALSE(frozen->weight.grad().defined());
  ddp->backward(other->forward(torch::ones({1, 3})).sum());
  EXPECT_TRUE(torch::allclose(model->weight.grad(), torch::full({1, 3}, 2.0)));
  EXPECT_TRUE(torch::allclose(other->weight.grad(), torch::full({1, 3}, 3.0)));
  ddp->teardown();
  // A second launch would join a new rendezvous beside the ended one.
  EXPECT_NE(error_of([&] {
              ddp->setup_environment();
            }).find("Fabric::launch: called a second time on this Fabric"),
            std::string::npos);
}

TEST(DdpOptionsTest, ConfigWordsParseToTheirEnumsAndBack) {
  for (CommHook h : {CommHook::kNone, CommHook::kFp16, CommHook::kBf16})
    EXPECT_EQ(fabric::strategies::parse_comm_hook(fabric::strategies::comm_hook_name(h)), h);
  EXPECT_EQ(fabric::strategies::parse_comm_hook("fp8"), std::nullopt);
  EXPECT_STREQ(fabric::strategies::comm_hook_name(CommHook::kBf16), "bf16");
  for (CpuBackend b : {CpuBackend::kAuto, CpuBackend::kGloo, CpuBackend::kShm})
    EXPECT_EQ(fabric::distributed::parse_cpu_backend(fabric::distributed::cpu_backend_name(b)), b);
  EXPECT_EQ(fabric::distributed::parse_cpu_backend("mpi"), std::nullopt);
  EXPECT_STREQ(fabric::distributed::cpu_backend_name(CpuBackend::kShm), "shm");
}

}  // namespace
