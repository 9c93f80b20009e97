// fabric::SGD / Adam / AdamW (fused and foreach) against torch::optim's per-parameter loop: the
// same gradients over many steps must give the same parameters and state; state moves between
// them; under a GradScaler the device-side skip matches the host-side one.
#include "fabric/training/fast_optimizers.h"

#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include <cmath>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/precision/grad_scaler.h"

namespace fabric {
namespace {

using MakeOptimizer =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

// Parameters of a few shapes (a matrix, a vector, a conv kernel), seeded.
std::vector<torch::Tensor> make_params(torch::Dtype dtype) {
  torch::manual_seed(7);
  return {torch::randn({16, 8}, dtype).requires_grad_(), torch::randn({8}, dtype).requires_grad_(),
          torch::randn({4, 3, 3, 3}, dtype).requires_grad_()};
}

std::vector<torch::Tensor> clone_params(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

// Gives every parameter the gradient of step `k` (the same for both optimizers); `scale`
// multiplies it (a GradScaler's scaled gradients).
void set_grads(std::vector<torch::Tensor>& params, int k, double scale = 1.0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + k);
  for (auto& p : params) {
    torch::Tensor g = at::normal(0.0, 1.0, p.sizes(), gen, p.options().requires_grad(false));
    p.mutable_grad() = g.mul(scale);
  }
}

double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

struct Case {
  std::string name;
  MakeOptimizer reference;
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>, OptimizerImpl)>
      ours;
};

std::vector<Case> cases() {
  using namespace torch::optim;  // NOLINT
  std::vector<Case> all;
  auto sgd = [&](std::string name, SGDOptions o) {
    all.push_back(
        {name, [o](auto p) { return std::make_unique<torch::optim::SGD>(p, o); },
         [o](auto p, OptimizerImpl i) { return std::make_unique<fabric::SGD>(p, o, i); }});
  };
  sgd("sgd_plain", SGDOptions(0.05));
  sgd("sgd_momentum", SGDOptions(0.05).momentum(0.9));
  sgd("sgd_nesterov_wd", SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-2));
  sgd("sgd_dampening", SGDOptions(0.05).momentum(0.8).dampening(0.3).weight_decay(5e-4));
  auto adam = [&](std::string name, AdamOptions o) {
    all.push_back(
        {name, [o](auto p) { return std::make_unique<torch::optim::Adam>(p, o); },
         [o](auto p, OptimizerImpl i) { return std::make_unique<fabric::Adam>(p, o, i); }});
  };
  adam("adam", AdamOptions(1e-2));
  adam("adam_l2_amsgrad", AdamOptions(1e-2).weight_decay(1e-2).amsgrad(true).betas({0.8, 0.99}));
  auto adamw = [&](std::string name, AdamWOptions o) {
    all.push_back(
        {name, [o](auto p) { return std::make_unique<torch::optim::AdamW>(p, o); },
         [o](auto p, OptimizerImpl i) { return std::make_unique<fabric::AdamW>(p, o, i); }});
  };
  adamw("adamw", AdamWOptions(1e-2).weight_decay(0.1));
  adamw("adamw_amsgrad_eps", AdamWOptions(3e-3).weight_decay(0.05).amsgrad(true).eps(1e-6));
  return all;
}

// Every case × {fused, foreach}: 60 steps of the same gradients from the same start, then the
// largest parameter difference to torch::optim must be below `tolerance`.
void expect_parity_over_60_steps(torch::Dtype dtype, double tolerance) {
  for (const auto& c : cases()) {
    for (OptimizerImpl impl : {OptimizerImpl::kFused, OptimizerImpl::kForeach}) {
      SCOPED_TRACE(c.name + " " + optimizer_impl_name(impl));
      auto ref_params = make_params(dtype);
      auto our_params = clone_params(ref_params);
      auto ref = c.reference(ref_params);
      auto ours = c.ours(our_params, impl);
      for (int k = 0; k < 60; ++k) {
        set_grads(ref_params, k);
        set_grads(our_params, k);
        ref->step();
        ours->step();
      }
      EXPECT_LT(max_difference(ref_params, our_params), tolerance);
      // The parameters moved: the comparison is not between two untouched copies.
      EXPECT_GT(max_difference(our_params, make_params(dtype)), 1e-2);
    }
  }
}

// float64: every implementation matches the reference to rounding.
TEST(FastOptimizers, MatchTorchOptimOverManySteps) {
  expect_parity_over_60_steps(torch::kFloat64, 1e-10);
}

// float32 as trained: within float rounding of the reference after 60 steps.
TEST(FastOptimizers, MatchInFloat32) { expect_parity_over_60_steps(torch::kFloat32, 2e-5); }

// Parameters without a gradient are left alone (no state), as torch::optim does; groups keep
// their own learning rates.
TEST(FastOptimizers, SkipsParametersWithoutGradientsAndHonoursGroups) {
  for (OptimizerImpl impl : {OptimizerImpl::kFused, OptimizerImpl::kForeach}) {
    auto params = make_params(torch::kFloat64);
    auto ref_params = clone_params(params);
    using G = torch::optim::OptimizerParamGroup;
    auto slow = [] { return std::make_unique<torch::optim::AdamOptions>(1e-3); };
    std::vector<G> ours_groups{G({params[0], params[1]}), G({params[2]}, slow())};
    std::vector<G> ref_groups{G({ref_params[0], ref_params[1]}), G({ref_params[2]}, slow())};
    fabric::Adam ours(ours_groups, torch::optim::AdamOptions(1e-1), impl);
    torch::optim::Adam ref(ref_groups, torch::optim::AdamOptions(1e-1));
    const torch::Tensor untouched = params[1].detach().clone();
    for (int k = 0; k < 10; ++k) {
      set_grads(params, k);
      set_grads(ref_params, k);
      params[1].mutable_grad() = torch::Tensor();
      ref_params[1].mutable_grad() = torch::Tensor();
      ours.step();
      ref.step();
    }
    EXPECT_TRUE(torch::equal(params[1], untouched));
    EXPECT_EQ(ours.state().count(params[1].unsafeGetTensorImpl()), 0u);
    EXPECT_LT(max_difference(params, ref_params), 1e-10);
  }
}

// A checkpoint written by ours (torch::save) continues identically in torch::optim, and back.
TEST(FastOptimizers, StateMovesToAndFromTorchOptim) {
  auto params = make_params(torch::kFloat64);
  auto ref_params = clone_params(params);
  const torch::optim::AdamWOptions options(1e-2);
  fabric::AdamW ours(params, options, OptimizerImpl::kFused);
  for (int k = 0; k < 7; ++k) {
    set_grads(params, k);
    ours.step();
  }
  for (size_t i = 0; i < params.size(); ++i) ref_params[i].detach().copy_(params[i]);
  std::stringstream bytes;
  torch::save(ours, bytes);
  torch::optim::AdamW ref(ref_params, options);
  torch::load(ref, bytes);
  for (int k = 7; k < 20; ++k) {
    set_grads(params, k);
    set_grads(ref_params, k);
    ours.step();
    ref.step();
  }
  EXPECT_LT(max_difference(params, ref_params), 1e-10);

  // And back: ours loads the reference's state (its device step counts follow the load).
  std::stringstream back;
  torch::save(ref, back);
  torch::load(ours, back);
  for (int k = 20; k < 25; ++k) {
    set_grads(params, k);
    set_grads(ref_params, k);
    ours.step();
    ref.step();
  }
  EXPECT_LT(max_difference(params, ref_params), 1e-10);
}

// Under a GradScaler, the fused path unscales and skips on the device; the result equals the
// host-decided path of torch::optim (same steps taken, same skipped ones, same step counts).
TEST(FastOptimizers, GradScalerOnTheDeviceMatchesHostDecision) {
  for (bool adam : {true, false}) {
    SCOPED_TRACE(adam ? "adam" : "sgd");
    auto params = make_params(torch::kFloat32);
    auto ref_params = clone_params(params);
    std::unique_ptr<torch::optim::Optimizer> ours, ref;
    if (adam) {
      ours = std::make_unique<fabric::Adam>(params, torch::optim::AdamOptions(1e-2),
                                            OptimizerImpl::kFused);
      ref = std::make_unique<torch::optim::Adam>(ref_params, torch::optim::AdamOptions(1e-2));
    } else {
      const auto o = torch::optim::SGDOptions(0.05).momentum(0.9);
      ours = std::make_unique<fabric::SGD>(params, o, OptimizerImpl::kFused);
      ref = std::make_unique<torch::optim::SGD>(ref_params, o);
    }
    ASSERT_TRUE(dynamic_cast<ScaledStep*>(ours.get())->takes_grad_scale());
    GradScaler our_scaler(GradScalerOptions().init_scale(1024.0).growth_interval(3));
    GradScaler ref_scaler(GradScalerOptions().init_scale(1024.0).growth_interval(3));
    for (int k = 0; k < 30; ++k) {
      our_scaler.scale(torch::ones({}));  // places the scale; gradients come from set_grads
      ref_scaler.scale(torch::ones({}));
      set_grads(params, k, our_scaler.get_scale());
      set_grads(ref_params, k, ref_scaler.get_scale());
      if (k == 0 || k % 7 == 3) {  // overflow, the first step included (fresh state)
        params[0].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
        ref_params[0].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
      }
      if (k % 5 == 1) {  // clipping-style explicit unscale before the step
        our_scaler.unscale_(*ours);
        ref_scaler.unscale_(*ref);
      }
      our_scaler.step(*ours);
      ref_scaler.step(*ref);
      our_scaler.update();
      ref_scaler.update();
    }
    EXPECT_EQ(our_scaler.skipped_steps(), ref_scaler.skipped_steps());
    EXPECT_GE(ref_scaler.skipped_steps(), 4);
    EXPECT_EQ(our_scaler.get_scale(), ref_scaler.get_scale());
    EXPECT_LT(max_difference(params, ref_params), 2e-5);
    if (adam) {
      auto* a = static_cast<fabric::Adam*>(ours.get());
      a->sync_state();
      const auto& s = static_cast<torch::optim::AdamParamState&>(
          *a->state().at(params[0].unsafeGetTensorImpl()));
      const auto& r = static_cast<torch::optim::AdamParamState&>(
          *ref->state().at(ref_params[0].unsafeGetTensorImpl()));
      EXPECT_EQ(s.step(), r.step());
      EXPECT_EQ(s.step(), 30 - ref_scaler.skipped_steps());
    }
  }
}

// Device learning rates (what a step captured in a CUDA graph reads): the fused step gives the
// same bits as with host ones while a schedule changes the rate every step; a rate that was not
// refreshed is not followed.
TEST(FastOptimizers, DeviceLearningRatesFollowTheScheduleBitwise) {
  for (const auto& c : cases()) {
    SCOPED_TRACE(c.name);
    auto host_params = make_params(torch::kFloat32);
    auto device_params = clone_params(host_params);
    auto host = c.ours(host_params, OptimizerImpl::kFused);
    auto device = c.ours(device_params, OptimizerImpl::kFused);
    auto* scaled = dynamic_cast<ScaledStep*>(device.get());
    ASSERT_NE(scaled, nullptr);
    scaled->set_device_lr(true);
    auto set_lr = [](torch::optim::Optimizer& o, double lr) {
      for (auto& g : o.param_groups()) g.options().set_lr(lr);
    };
    for (int k = 0; k < 20; ++k) {
      const double lr = std::ldexp(1.0, -(5 + k % 3));  // exact in float32, as the device holds it
      set_lr(*host, lr);
      set_lr(*device, lr);
      scaled->refresh_lr();
      set_grads(host_params, k);
      set_grads(device_params, k);
      host->step();
      device->step();
    }
    EXPECT_EQ(max_difference(host_params, device_params), 0.0);
    set_lr(*host, 0.5);
    set_lr(*device, 0.5);  // not refreshed: the device still holds the last rate
    set_grads(host_params, 20);
    set_grads(device_params, 20);
    host->step();
    device->step();
    EXPECT_GT(max_difference(host_params, device_params), 0.0);
  }
}

// A step moves each stepped parameter's version counter, as an in-place op would (ATen's fused
// kernels do not): what keys on it (autograd's saved-tensor check, the float8 weight casts kept
// by fabric/nn/fp8.h) sees the change. A parameter without a gradient keeps its version.
TEST(FastOptimizers, EveryStepMovesTheParametersVersion) {
  for (OptimizerImpl impl : {OptimizerImpl::kFused, OptimizerImpl::kForeach}) {
    for (int kind = 0; kind < 3; ++kind) {
      auto params = make_params(torch::kFloat32);
      std::unique_ptr<torch::optim::Optimizer> opt =
          kind == 0   ? std::unique_ptr<torch::optim::Optimizer>(std::make_unique<fabric::SGD>(
                          params, torch::optim::SGDOptions(0.1).momentum(0.9), impl))
          : kind == 1 ? std::unique_ptr<torch::optim::Optimizer>(std::make_unique<fabric::Adam>(
                            params, torch::optim::AdamOptions(0.1), impl))
                      : std::unique_ptr<torch::optim::Optimizer>(std::make_unique<fabric::AdamW>(
                            params, torch::optim::AdamWOptions(0.1), impl));
      for (int k = 0; k < 2; ++k) {
        set_grads(params, k);
        params[1].mutable_grad() = torch::Tensor();
        std::vector<int64_t> before;
        for (const auto& p : params) before.push_back(p._version());
        opt->step();
        const std::string what =
            std::string(impl == OptimizerImpl::kFused ? "fused " : "foreach ") + (kind == 0 ? "SGD"
                                                                                  : kind == 1
                                                                                      ? "Adam"
                                                                                      : "AdamW");
        EXPECT_GT(params[0]._version(), before[0]) << what;
        EXPECT_GT(params[2]._version(), before[2]) << what;
        EXPECT_EQ(params[1]._version(), before[1]) << what << ": a parameter without a gradient";
      }
    }
  }
}

TEST(FastOptimizers, RefusesSparseGradientsAndUnknownImplementations) {
  auto params = make_params(torch::kFloat32);
  fabric::SGD sgd(params, torch::optim::SGDOptions(0.1), OptimizerImpl::kForeach);
  params[1].mutable_grad() = torch::ones({8}).to_sparse();
  try {
    sgd.step();
    FAIL() << "expected fabric::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.implementation: for_loop"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_optimizer_impl("fast"), Error);
  EXPECT_EQ(parse_optimizer_impl("foreach"), OptimizerImpl::kForeach);
  EXPECT_EQ(fabric::SGD(params, torch::optim::SGDOptions(0.1)).implementation(),
            OptimizerImpl::kFused);
}

}  // namespace
}  // namespace fabric
