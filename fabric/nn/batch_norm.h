// fabric::nn::BatchNorm1d/2d/3d: torch::nn::BatchNorm*d that can synchronize statistics across the
// processes of a job (SyncBatchNorm), on CPU and CUDA.
//
// Same options (torch::nn::BatchNormOptions), parameters, buffers and state_dict keys as
// torch::nn::BatchNorm*d ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"),
// so checkpoints move between the two. Without a process group (the default), or in eval mode, or
// with one process, forward is exactly torch's BatchNorm. With a process group (set by
// convert_sync_batchnorm, which Fabric::setup calls for fabric.sync_batchnorm: true) a training
// forward normalizes with the mean and variance of the global batch (the union of every rank's
// batch; ranks may have different or empty batches) and updates the running statistics as
// BatchNorm on that global batch would (unbiased variance over the global count). Backward
// all-reduces the two per-channel reductions so input gradients are those of the global batch;
// weight/bias gradients are this rank's share (DDP then averages them, as in PyTorch).
//
// Every rank must call forward/backward of a synchronized BatchNorm in the same order (they are
// collectives). CUDA uses ATen's batch_norm_stats / batch_norm_gather_stats_with_counts /
// batch_norm_elemt / batch_norm_backward_reduce / batch_norm_backward_elemt; CPU (which PyTorch's
// SyncBatchNorm does not support) uses ATen's fused CPU batch-norm kernels where the parameters
// are in the accumulation type, else ordinary tensor ops in fp32 (fp64 for double inputs).
//
// Example (a model that syncs under DDP with fabric.sync_batchnorm: true):
//   struct NetImpl : torch::nn::Module {
//     fabric::nn::BatchNorm2d bn{register_module("bn", fabric::nn::BatchNorm2d(64))};
//   };
#ifndef FABRIC_NN_BATCH_NORM_H_
#define FABRIC_NN_BATCH_NORM_H_

#include <c10/util/intrusive_ptr.h>
#include <torch/nn/modules/batchnorm.h>

#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace c10d {
class ProcessGroup;
}

namespace fabric::nn {

namespace detail {

// Opaque holder of a c10d::ProcessGroup (keeps this header free of c10d's).
struct GroupHandle;
using Group = std::shared_ptr<const GroupHandle>;
// Null for a null group.
Group make_group(const c10::intrusive_ptr<c10d::ProcessGroup>& group);
// Number of ranks in `group` (1 for a null group).
int64_t group_size(const Group& group);

// The statistics and buffers one synchronized batch-norm call reads and updates.
struct SyncBatchNormArgs {
  torch::Tensor running_mean;  // updated in place when defined
  torch::Tensor running_var;
  double momentum = 0.1;  // factor for the running statistics
  double eps = 1e-5;
  Group group;
};

// Batch norm over the union of the batches of every rank of `args.group` (differentiable in
// input, weight and bias). Used by the modules below; public for tests of the CPU/CUDA paths.
torch::Tensor sync_batch_norm(const torch::Tensor& input, const torch::Tensor& weight,
                              const torch::Tensor& bias, const SyncBatchNormArgs& args);

// Throws fabric::Error unless input.dim() is one of `allowed` (message as torch's BatchNorm).
void check_input_dim(const torch::Tensor& input, const std::vector<int64_t>& allowed,
                     const char* module_name);

}  // namespace detail

template <size_t D, typename Derived>
class SyncBatchNormImplBase : public torch::nn::BatchNormImplBase<D, Derived> {
  using Base = torch::nn::BatchNormImplBase<D, Derived>;

 public:
  using Base::Base;

  torch::Tensor forward(const torch::Tensor& input) {
    if (!this->is_training() || detail::group_size(group_) <= 1) return Base::forward(input);
    this->_check_input_dim(input);
    // Same momentum rules as torch's BatchNorm (None: cumulative moving average).
    double factor = this->options.momentum().value_or(0.0);
    const bool track = this->options.track_running_stats();
    if (track && this->num_batches_tracked.defined()) {
      this->num_batches_tracked += 1;
      if (!this->options.momentum().has_value())
        factor = 1.0 / this->num_batches_tracked.template item<double>();
    }
    detail::SyncBatchNormArgs args;
    if (track) {
      args.running_mean = this->running_mean;
      args.running_var = this->running_var;
    }
    args.momentum = factor;
    args.eps = this->options.eps();
    args.group = group_;
    return detail::sync_batch_norm(input, this->weight, this->bias, args);
  }

  // Synchronize over `group` (null: behave as torch's BatchNorm).
  void set_process_group(const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
    group_ = detail::make_group(group);
  }
  // Whether forward synchronizes (a group of more than one rank is set).
  bool synchronized() const { return detail::group_size(group_) > 1; }

  // Takes over the state of `other` (a torch::nn::BatchNorm*d of the same options): the very same
  // parameter tensors (so optimizers built on them stay valid), copies of its buffers, its
  // training mode, device and dtype. Used by convert_sync_batchnorm.
  template <typename Other>
  void adopt(const Other& other) {
    const torch::Tensor& like = other.running_mean.defined() ? other.running_mean : other.weight;
    if (like.defined()) this->to(like.device(), like.scalar_type());
    this->train(other.is_training());
    torch::NoGradGuard no_grad;
    if (other.weight.defined()) {
      this->weight = this->parameters_["weight"] = other.weight;
      this->bias = this->parameters_["bias"] = other.bias;
    }
    for (auto [mine, theirs] : {std::pair(this->running_mean, other.running_mean),
                                std::pair(this->running_var, other.running_var),
                                std::pair(this->num_batches_tracked, other.num_batches_tracked)}) {
      if (mine.defined() && theirs.defined()) mine.copy_(theirs);
    }
  }

  void pretty_print(std::ostream& stream) const override {
    stream << "fabric::nn::";
    std::ostringstream torch_form;
    Base::pretty_print(torch_form);
    stream << torch_form.str().substr(std::string("torch::nn::").size());
    if (group_) stream << "[sync over " << detail::group_size(group_) << " ranks]";
  }

 private:
  detail::Group group_;
};

class BatchNorm1dImpl : public SyncBatchNormImplBase<1, BatchNorm1dImpl> {
 public:
  using SyncBatchNormImplBase<1, BatchNorm1dImpl>::SyncBatchNormImplBase;

 protected:
  void _check_input_dim(const torch::Tensor& input) override {
    detail::check_input_dim(input, {2, 3}, "BatchNorm1d");
  }
};
TORCH_MODULE(BatchNorm1d);

class BatchNorm2dImpl : public SyncBatchNormImplBase<2, BatchNorm2dImpl> {
 public:
  using SyncBatchNormImplBase<2, BatchNorm2dImpl>::SyncBatchNormImplBase;

 protected:
  void _check_input_dim(const torch::Tensor& input) override {
    detail::check_input_dim(input, {4}, "BatchNorm2d");
  }
};
TORCH_MODULE(BatchNorm2d);

class BatchNorm3dImpl : public SyncBatchNormImplBase<3, BatchNorm3dImpl> {
 public:
  using SyncBatchNormImplBase<3, BatchNorm3dImpl>::SyncBatchNormImplBase;

 protected:
  void _check_input_dim(const torch::Tensor& input) override {
    detail::check_input_dim(input, {5}, "BatchNorm3d");
  }
};
TORCH_MODULE(BatchNorm3d);

struct SyncBatchNormReport {
  // Module paths now synchronizing ("features.1", "layers.0.bn1", ...).
  std::vector<std::string> synchronized;
  // Paths of torch::nn::BatchNorm*d held as plain members of a user module: they cannot be
  // replaced (the user's member variable would keep pointing at the old module).
  std::vector<std::string> not_replaceable;
};

// Makes every BatchNorm under `root` synchronize over `group`: fabric::nn::BatchNorm*d get the
// group; torch::nn::BatchNorm*d inside Sequential, ModuleList or ModuleDict are replaced by the
// fabric module of the same options that keeps the very same parameter tensors (optimizers built
// before stay valid) and copies the buffers. Others are listed in not_replaceable. The root itself
// is never replaced.
SyncBatchNormReport convert_sync_batchnorm(torch::nn::Module& root,
                                           const c10::intrusive_ptr<c10d::ProcessGroup>& group);

// As above, but throws fabric::Error naming each not_replaceable path and the fix (declare it as
// fabric::nn::BatchNorm*d or hold it in a torch::nn::Sequential).
SyncBatchNormReport convert_sync_batchnorm_or_throw(
    torch::nn::Module& root, const c10::intrusive_ptr<c10d::ProcessGroup>& group);

}  // namespace fabric::nn

#endif  // FABRIC_NN_BATCH_NORM_H_
