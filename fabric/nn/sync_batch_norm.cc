// Synchronized batch norm: statistics of the global batch (forward) and of its gradient
// (backward), exchanged over a c10d process group. Layout of one rank's statistics row (what is
// all-gathered): [mean (C) | spread (C) | count (1)], in fp32 (fp64 for double inputs), where
// spread is the biased variance on CPU and the inverse standard deviation on CUDA (the form ATen's
// CUDA kernels take).
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <sstream>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"
#include "fabric/nn/batch_norm.h"

namespace fabric::nn::detail {

struct GroupHandle {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
};

namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Dimensions reduced per channel: all but dimension 1.
std::vector<int64_t> reduce_dims(const Tensor& t) {
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < t.dim(); ++d) dims.push_back(d);
  return dims;
}

// Shape that broadcasts a per-channel vector against `t`: {1, C, 1, ...}.
std::vector<int64_t> channel_shape(const Tensor& t) {
  std::vector<int64_t> shape(static_cast<size_t>(t.dim()), 1);
  shape[1] = t.size(1);
  return shape;
}

torch::ScalarType accumulate_type(const Tensor& input) {
  return input.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

void all_reduce_sum(Tensor& t, c10d::ProcessGroup& group) {
  std::vector<Tensor> tensors = {t};
  distributed::wait(group.allreduce(tensors), "sync_batch_norm backward (all_reduce)");
}

class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, Tensor input, Tensor weight, Tensor bias,
                        const SyncBatchNormArgs* args) {
    const int64_t channels = input.size(1);
    const int64_t local_count = channels == 0 ? 0 : input.numel() / channels;
    c10d::ProcessGroup& group = *args->group->group;
    const bool cuda = input.is_cuda();
    const auto acc = accumulate_type(input);
    const auto opts = input.options().dtype(acc);

    // CPU with parameters in the accumulation type (32-true, 64-true, bf16-mixed): ATen's fused
    // CPU batch-norm kernels on the input as it is (bf16 or channels-last included), one pass
    // each for the statistics, the output and the backward sums. Otherwise (bf16-true, whose
    // parameters are bf16) plain tensor ops in the accumulation type.
    // (An empty local batch takes the plain path: the kernels divide by the element count.)
    const bool fused_cpu = !cuda && local_count > 0 &&
                           (!weight.defined() || weight.scalar_type() == acc) &&
                           (!bias.defined() || bias.scalar_type() == acc);
    Tensor x = cuda ? input.contiguous() : fused_cpu ? input : input.to(acc);
    Tensor local_mean, local_spread;
    if (local_count == 0) {
      local_mean = torch::zeros({channels}, opts);
      local_spread = torch::zeros({channels}, opts);
    } else if (cuda) {
      std::tie(local_mean, local_spread) = at::batch_norm_stats(x, args->eps);
    } else if (fused_cpu) {
      // Scratch running statistics with momentum 0: the kernel returns the biased variance in
      // their dtype (float for bf16 input) and leaves the module's own statistics alone.
      std::tie(local_mean, local_spread) = at::batch_norm_update_stats(
          x, torch::zeros({channels}, opts), torch::ones({channels}, opts), 0.0);
    } else {
      const auto dims = reduce_dims(x);
      local_mean = x.mean(dims);
      local_spread = x.var(dims, /*unbiased=*/false);
    }
    const Tensor row = torch::cat({local_mean.to(acc), local_spread.to(acc),
                                   torch::full({1}, static_cast<double>(local_count), opts)});
    const Tensor rows =
        torch::stack(distributed::all_gather(group, row, "sync_batch_norm forward (all_gather)"));
    Tensor counts = rows.select(1, 2 * channels);
    const double total = counts.sum().item<double>();
    if (total <= 1) {
      throw Error(
          "sync_batch_norm: expected more than 1 value per channel in the global batch "
          "when training, got " +
          std::to_string(static_cast<int64_t>(total)) + " over " + std::to_string(group.getSize()) +
          " ranks");
    }
    Tensor means = rows.narrow(1, 0, channels);
    Tensor spreads = rows.narrow(1, channels, channels);

    Tensor mean, invstd, var;
    if (cuda) {
      const Tensor present = counts.gt(0);  // empty ranks carry no statistics
      // ATen's CUDA kernel reads the counts in the running statistics' dtype (the input's when
      // there are none): bf16 under bf16-true, not our float32 row.
      const auto count_type =
          args->running_mean.defined() ? args->running_mean.scalar_type() : x.scalar_type();
      std::tie(mean, invstd) = at::batch_norm_gather_stats_with_counts(
          x, means.index({present}).to(acc), spreads.index({present}).to(acc), args->running_mean,
          args->running_var, args->momentum, args->eps, counts.index({present}).to(count_type));
    } else {
      // Parallel variance: M2 = sum_r n_r (var_r + (mean_r - mean)^2).
      const Tensor n_r = counts.unsqueeze(1);
      mean = (n_r * means).sum(0) / total;
      var = (n_r * (spreads + (means - mean).pow(2))).sum(0) / total;
      invstd = (var + args->eps).rsqrt();
      if (args->running_mean.defined()) {
        torch::NoGradGuard no_grad;
        const double m = args->momentum;
        args->running_mean.mul_(1 - m).add_(mean.to(args->running_mean.scalar_type()), m);
        args->running_var.mul_(1 - m).add_(
            (var * (total / (total - 1))).to(args->running_var.scalar_type()), m);
      }
    }

    Tensor output;
    if (cuda) {
      output = at::batch_norm_elemt(x, weight, bias, mean, invstd, args->eps);
    } else if (fused_cpu) {
      // The inference kernel normalizes with given statistics: the global ones.
      output = at::batch_norm(x, weight, bias, mean, var, /*training=*/false, 0.0, args->eps,
                              /*cudnn_enabled=*/false);
    } else {
      const auto shape = channel_shape(x);
      Tensor scale = invstd;
      if (weight.defined()) scale = scale * weight.to(acc);
      output = (x - mean.view(shape)) * scale.view(shape);
      if (bias.defined()) output = output + bias.to(acc).view(shape);
      output = output.to(input.scalar_type());
    }
    ctx->save_for_backward({x, weight, mean, invstd, counts});
    ctx->saved_data["group"] = c10::IValue::make_capsule(args->group->group);
    ctx->saved_data["fused_cpu"] = fused_cpu;
    return output;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3],
                 &counts = saved[4];
    auto group = c10::static_intrusive_pointer_cast<c10d::ProcessGroup>(
        ctx->saved_data["group"].toCapsule());
    const int64_t channels = x.size(1);
    const bool need_input = ctx->needs_input_grad(0);
    const bool need_weight = weight.defined() && ctx->needs_input_grad(1);
    const bool need_bias = ctx->needs_input_grad(2);
    Tensor grad_out = grad_outputs[0];
    Tensor grad_input, grad_weight, grad_bias;

    if (x.is_cuda()) {
      grad_out = grad_out.contiguous();
      Tensor sum_dy, sum_dy_xmu;
      std::tie(sum_dy, sum_dy_xmu, grad_weight, grad_bias) = at::batch_norm_backward_reduce(
          grad_out, x, mean, invstd, weight, need_input, need_weight, need_bias);
      if (need_input) {
        Tensor both = torch::cat({sum_dy, sum_dy_xmu});
        all_reduce_sum(both, *group);
        grad_input = at::batch_norm_backward_elemt(
            grad_out, x, mean, invstd, weight, both.narrow(0, 0, channels),
            both.narrow(0, channels, channels), counts.to(torch::kInt));
      }
    } else if (ctx->saved_data["fused_cpu"].toBool()) {
      // Local sums in one fused pass: with save_invstd = 1 the kernel's grad_weight is
      // sum(dy * (x - mean)) and its grad_bias sum(dy).
      const auto shape = channel_shape(x);
      Tensor sum_dy_xmu, sum_dy;
      std::tie(std::ignore, sum_dy_xmu, sum_dy) = at::native_batch_norm_backward(
          grad_out, x, /*weight=*/{}, /*running_mean=*/{}, /*running_var=*/{}, mean,
          torch::ones_like(invstd), /*train=*/true, 0.0, {false, true, true});
      if (need_weight) grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
      if (need_bias)
        grad_bias = sum_dy.to(weight.defined() ? weight.scalar_type() : mean.scalar_type());
      if (need_input) {
        Tensor both = torch::cat({sum_dy, sum_dy_xmu});
        all_reduce_sum(both, *group);
        const double total = counts.sum().item<double>();
        // grad_input = a * dy + b * x + c per channel, in two passes over dy and x.
        Tensor a = weight.defined() ? invstd * weight : invstd;
        const Tensor b = -a * invstd.pow(2) * (both.narrow(0, channels, channels) / total);
        const Tensor c = -a * (both.narrow(0, 0, channels) / total) - b * mean;
        grad_input = grad_out * a.view(shape);
        grad_input.addcmul_(x, b.view(shape)).add_(c.view(shape));
        grad_input = grad_input.to(grad_outputs[0].scalar_type());
      }
    } else {
      const auto dims = reduce_dims(x);
      const auto shape = channel_shape(x);
      const Tensor g = grad_out.to(x.scalar_type());
      const Tensor xmu = x - mean.view(shape);
      Tensor sum_dy = g.sum(dims);
      Tensor sum_dy_xmu = (g * xmu).sum(dims);
      if (need_weight) grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
      if (need_bias)
        grad_bias = sum_dy.to(weight.defined() ? weight.scalar_type() : x.scalar_type());
      if (need_input) {
        Tensor both = torch::cat({sum_dy, sum_dy_xmu});
        all_reduce_sum(both, *group);
        const double total = counts.sum().item<double>();
        const Tensor mean_dy = both.narrow(0, 0, channels) / total;
        const Tensor mean_dy_xmu = both.narrow(0, channels, channels) / total;
        Tensor scale = invstd;
        if (weight.defined()) scale = scale * weight.to(x.scalar_type());
        grad_input = (g - mean_dy.view(shape) - xmu * (invstd.pow(2) * mean_dy_xmu).view(shape)) *
                     scale.view(shape);
        grad_input = grad_input.to(grad_outputs[0].scalar_type());
      }
    }
    return {grad_input, need_weight ? grad_weight : Tensor(), need_bias ? grad_bias : Tensor(),
            Tensor()};
  }
};

}  // namespace

Group make_group(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  return group ? std::make_shared<const GroupHandle>(GroupHandle{group}) : nullptr;
}

int64_t group_size(const Group& group) { return group ? group->group->getSize() : 1; }

void check_input_dim(const torch::Tensor& input, const std::vector<int64_t>& allowed,
                     const char* module_name) {
  for (int64_t d : allowed)
    if (input.dim() == d) return;
  std::ostringstream want;
  for (size_t i = 0; i < allowed.size(); ++i) want << (i ? " or " : "") << allowed[i] << "D";
  throw Error(std::string("fabric::nn::") + module_name + ": expected " + want.str() +
              " input (got " + std::to_string(input.dim()) + "D input)");
}

torch::Tensor sync_batch_norm(const torch::Tensor& input, const torch::Tensor& weight,
                              const torch::Tensor& bias, const SyncBatchNormArgs& args) {
  if (!args.group) throw Error("sync_batch_norm: no process group");
  if (input.dim() < 2)
    throw Error("sync_batch_norm: expected input with a channel dimension (N, C, ...)");
  return SyncBatchNormFunction::apply(input, weight, bias, &args);
}

}  // namespace fabric::nn::detail
