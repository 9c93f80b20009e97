#include "fabric/precision/grad_scaler.h"

#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include <ATen/ops/_fused_sgd.h>

#include <cmath>

#include "fabric/core/error.h"

namespace {

// The reference recipe (torch.amp.GradScaler semantics) in plain doubles.
struct ReferenceScaler {
  double scale, growth, backoff;
  int interval, tracker = 0;
  void update(bool found_inf) {
    if (found_inf) {
      scale *= backoff;
      tracker = 0;
    } else if (++tracker == interval) {
      scale *= growth;
      tracker = 0;
    }
  }
};

// loss = sum(p * w) with w all-finite, or with one inf (so one gradient entry becomes inf).
torch::Tensor loss_for(const torch::Tensor& p, int step, bool inf) {
  auto w = torch::tensor({0.5f, -1.25f, 2.0f}) * static_cast<float>(step + 1);
  if (inf) w[1] = INFINITY;
  return (p * w).sum();
}

TEST(GradScalerTest, ScaleTrajectoryFollowsTheRecipeAndInfStepsAreSkipped) {
  fabric::GradScalerOptions options;
  options.init_scale(8.0);
  options.growth_interval(3);
  fabric::GradScaler scaler(options);
  ReferenceScaler ref{8.0, 2.0, 0.5, 3};

  auto p = torch::tensor({1.0f, 2.0f, 3.0f}, torch::requires_grad());
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.125).momentum(0.5));
  // Reference parameter trained without scaling on the finite steps only.
  auto q = torch::tensor({1.0f, 2.0f, 3.0f}, torch::requires_grad());
  torch::optim::SGD sgd_ref({q}, torch::optim::SGDOptions(0.125).momentum(0.5));

  const std::vector<bool> pattern = {false, false, false, true,  false, true,  true,
                                     false, false, false, false, false, false, true};
  for (size_t i = 0; i < pattern.size(); ++i) {
    const bool inf = pattern[i];
    sgd.zero_grad();
    const auto before = p.detach().clone();
    const auto momentum_before =
        sgd.state().empty()
            ? torch::Tensor()
            : static_cast<torch::optim::SGDParamState&>(*sgd.state().begin()->second)
                  .momentum_buffer()
                  .clone();
    scaler.scale(loss_for(p, static_cast<int>(i), inf)).backward();
    const bool stepped = scaler.step(sgd);
    scaler.update();
    ref.update(inf);

    EXPECT_EQ(stepped, !inf) << "step " << i;
    EXPECT_EQ(scaler.get_scale(), ref.scale) << "step " << i;
    EXPECT_EQ(scaler.growth_tracker(), ref.tracker) << "step " << i;
    if (inf) {
      // A skipped step changes neither the parameters nor the optimizer state.
      EXPECT_TRUE(torch::equal(p.detach(), before)) << "step " << i;
      if (momentum_before.defined()) {
        const auto& state = static_cast<torch::optim::SGDParamState&>(*sgd.state().begin()->second);
        EXPECT_TRUE(torch::equal(state.momentum_buffer(), momentum_before)) << "step " << i;
      }
    } else {
      sgd_ref.zero_grad();
      loss_for(q, static_cast<int>(i), false).backward();
      sgd_ref.step();
      // Scales are powers of two, so unscaled gradients are exact: bitwise equal trajectories.
      EXPECT_TRUE(torch::equal(p.detach(), q.detach())) << "step " << i;
    }
  }
  EXPECT_EQ(scaler.skipped_steps(), 4);
}

TEST(GradScalerTest, UnscaleBeforeStepHappensOnceAndShowsTrueGradients) {
  fabric::GradScaler scaler;
  auto p = torch::tensor({1.0f, -2.0f}, torch::requires_grad());
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.5));
  scaler.scale((p * p).sum()).backward();
  EXPECT_TRUE(torch::equal(p.grad(), torch::tensor({2.0f, -4.0f}) * 65536.0f));
  scaler.unscale_(sgd);
  EXPECT_TRUE(torch::equal(p.grad(), torch::tensor({2.0f, -4.0f})));  // e.g. for clipping
  EXPECT_THROW(scaler.unscale_(sgd), fabric::Error);
  EXPECT_TRUE(scaler.step(sgd));
  EXPECT_TRUE(torch::equal(p.detach(), torch::tensor({0.0f, 0.0f})));  // not unscaled twice
  scaler.update();
}

TEST(GradScalerTest, MisuseIsReported) {
  fabric::GradScaler scaler;
  EXPECT_THROW(scaler.update(), fabric::Error);  // no step recorded
  fabric::GradScalerOptions bad;
  bad.backoff_factor(1.5);
  EXPECT_THROW(fabric::GradScaler{bad}, fabric::Error);

  auto h = torch::ones({2}, torch::dtype(torch::kHalf).requires_grad(true));
  torch::optim::SGD sgd({h}, torch::optim::SGDOptions(0.1));
  h.mutable_grad() = torch::ones({2}, torch::kHalf);
  EXPECT_THROW(scaler.unscale_(sgd), fabric::Error);

  // A step before any backward (no gradient at all): a step of nothing, and update() and the
  // next step work (update said "call step() first", then step "already called").
  auto p = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD plain({p}, torch::optim::SGDOptions(0.1));
  fabric::GradScaler fresh;
  EXPECT_TRUE(fresh.step(plain));
  EXPECT_NO_THROW(fresh.update());
  fresh.scale(loss_for(p, 0, false)).backward();
  EXPECT_TRUE(fresh.step(plain));
  EXPECT_NO_THROW(fresh.update());
  EXPECT_FALSE(torch::equal(p, torch::ones({3})));
}

TEST(GradScalerTest, StateDictRoundTripsAndNamesBadKeys) {
  fabric::GradScalerOptions options;
  options.init_scale(1024.0);
  options.growth_interval(2);
  fabric::GradScaler a(options);
  auto p = torch::ones({1}, torch::requires_grad());
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
  for (int i = 0; i < 3; ++i) {  // finite, finite (grow), finite
    sgd.zero_grad();
    a.scale(p.sum()).backward();
    a.step(sgd);
    a.update();
  }
  fabric::GradScaler b;
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.get_scale(), 2048.0);
  EXPECT_EQ(b.growth_tracker(), 1);
  EXPECT_EQ(b.options().growth_interval(), 2);
  EXPECT_EQ(b.state_dict(), a.state_dict());

  auto state = a.state_dict();
  state.erase("growth_tracker");
  state["scael"] = 1.0;
  try {
    b.load_state_dict(state);
    FAIL() << "expected an error";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(
        e.what(),
        "GradScaler::load_state_dict: missing keys [growth_tracker], unexpected keys [scael]");
  }
}

TEST(GradScalerTest, DisabledScalerIsTheIdentity) {
  fabric::GradScalerOptions options;
  options.enabled(false);
  fabric::GradScaler scaler(options);
  auto loss = torch::tensor(3.0f);
  EXPECT_TRUE(torch::equal(scaler.scale(loss), loss));
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

}  // namespace

namespace {

// A float16 loss is scaled in float32: the initial scale (65536) does not fit float16.
TEST(GradScalerTest, Float16LossIsScaledWithoutOverflow) {
  fabric::GradScaler scaler;
  const torch::Tensor loss = torch::tensor(3.0, torch::kHalf);
  const torch::Tensor scaled = scaler.scale(loss);
  EXPECT_TRUE(torch::isfinite(scaled).all().item<bool>()) << scaled;
  EXPECT_EQ(scaled.scalar_type(), torch::kFloat32);
  EXPECT_DOUBLE_EQ(scaled.item<double>(), 3.0 * 65536.0);
}

// Flags from several devices combine to 1, not to their count: the fused kernels skip only
// where found_inf == 1, so a 2 would let an inf step through.
TEST(GradScalerTest, FoundInfFlagsCombineToOneForTheFusedKernels) {
  const std::vector<torch::Tensor> flags = {torch::ones({1}), torch::ones({1}), torch::zeros({1})};
  const torch::Tensor found = fabric::GradScaler::combine_found_inf(flags, torch::kCPU);
  EXPECT_EQ(found.item<float>(), 1.0f);
  EXPECT_EQ(
      fabric::GradScaler::combine_found_inf({torch::zeros({1}), torch::zeros({1})}, torch::kCPU)
          .item<float>(),
      0.0f);
  // The kernel itself: a step with the combined flag is skipped.
  std::vector<torch::Tensor> params = {torch::ones({3})}, grads = {torch::full({3}, 0.5)};
  const torch::Tensor before = params[0].clone();
  at::_fused_sgd_(params, grads, {}, 0.0, 0.0, 0.1, 0.0, false, false, false, {}, found);
  EXPECT_TRUE(torch::equal(params[0], before));
}

}  // namespace

namespace {

// Sharded optimizers (fabric.ddp.shard_optimizer_state): each rank checks only its part of the
// gradients, so the found-inf flag goes through the agreement (an all-reduce max in Ddp). Here the
// "other rank" found an inf: this rank's finite step must be skipped and the scale backed off.
TEST(GradScalerTest, FoundInfAgreementDecidesTheStep) {
  fabric::GradScalerOptions options;
  options.init_scale(8.0);
  fabric::GradScaler scaler(options);
  int calls = 0;
  bool other_rank_found_inf = true;
  scaler.set_found_inf_agreement([&](torch::Tensor& found) {
    ++calls;
    if (other_rank_found_inf) found.fill_(1.0);
  });
  auto p = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.1));
  scaler.scale(loss_for(p, 0, /*inf=*/false)).backward();
  EXPECT_FALSE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(torch::equal(p.detach(), torch::ones({3})));
  EXPECT_EQ(scaler.get_scale(), 4.0);
  // Every rank finite: the step happens.
  other_rank_found_inf = false;
  sgd.zero_grad();
  scaler.scale(loss_for(p, 0, /*inf=*/false)).backward();
  EXPECT_TRUE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(torch::equal(p.detach(), torch::ones({3})));
}

}  // namespace
