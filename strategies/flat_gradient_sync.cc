#include "strategies/flat_gradient_sync.h"

#include <ATen/ScalarOps.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <sstream>
#include <utility>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"

namespace fabric::strategies {

FlatGradientSync::FlatGradientSync(std::vector<torch::Tensor> params,
                                   std::vector<std::string> names,
                                   c10::intrusive_ptr<c10d::ProcessGroup> pg, CommHook comm_hook)
    : params_(std::move(params)), names_(std::move(names)), pg_(std::move(pg)) {
  if (comm_hook != CommHook::kNone) {
    compress_ = true;
    wire_dtype_ = comm_hook == CommHook::kFp16 ? torch::kHalf : torch::kBFloat16;
  }
  names_.resize(params_.size());
}

FlatGradientSync::~FlatGradientSync() = default;

void FlatGradientSync::build() {
  // Autograd gives every gradient its parameter's dtype and device: group by those.
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& param = params_[i];
    size_t b = 0;
    while (b < buffers_.size() && (buffers_[b].flat.scalar_type() != param.scalar_type() ||
                                   buffers_[b].flat.device() != param.device()))
      ++b;
    if (b == buffers_.size()) {
      buffers_.push_back({torch::empty({0}, param.options()), {}, {}, {}, {}});
      sizes.push_back(0);
    }
    buffers_[b].members.push_back(i);
    buffers_[b].offsets.push_back(sizes[b]);
    sizes[b] += param.numel();
  }
  for (size_t b = 0; b < buffers_.size(); ++b) {
    Buffer& buffer = buffers_[b];
    buffer.flat = torch::empty({sizes[b]}, buffer.flat.options());
    if (compress_) buffer.wire = torch::empty({sizes[b]}, buffer.flat.options().dtype(wire_dtype_));
    std::ostringstream what;
    what << "gradient all_reduce (" << buffer.flat.scalar_type() << " [" << sizes[b] << "])";
    buffer.description = what.str();
  }
}

void FlatGradientSync::run() {
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& grad = params_[i].grad();
    if (!grad.defined()) {
      throw Error(
          "ddp: parameter '" + names_[i] + "' has no gradient after backward on rank " +
          std::to_string(pg_->getRank()) +
          "; a captured step (fabric.cuda_graphs) needs a gradient for every parameter in "
          "every step: set fabric.cuda_graphs: false, and fabric.ddp.find_unused_parameters: "
          "true if the model leaves parameters unused");
    }
    if (grad.is_sparse()) throw Error("ddp: parameter '" + names_[i] + "' has a sparse gradient");
  }
  if (buffers_.empty()) build();  // at the first run, not at setup: Reducer-only jobs never pay

  const int64_t world = pg_->getSize();
  // The Reducer's factor: a wrapped double scalar, so the product is computed in the gradient's
  // dtype exactly as its bucket copy does (bitwise the same averaged gradients).
  const torch::Tensor inverse_world = at::native::wrapped_scalar_tensor(1.0 / world);
  torch::NoGradGuard no_grad;
  for (Buffer& buffer : buffers_) {
    std::vector<torch::Tensor> slots;
    slots.reserve(buffer.members.size());
    for (size_t k = 0; k < buffer.members.size(); ++k) {
      const torch::Tensor& grad = params_[buffer.members[k]].grad();
      slots.push_back(buffer.flat.narrow(0, buffer.offsets[k], grad.numel()).view(grad.sizes()));
      if (compress_) {
        slots.back().copy_(grad);
      } else {
        at::mul_out(slots.back(), grad, inverse_world);
      }
    }
    std::vector<torch::Tensor> wire = {buffer.flat};
    if (compress_) {
      buffer.wire.copy_(buffer.flat);
      buffer.wire.div_(world);  // before the sum, against overflow (as the Reducer's hooks)
      wire = {buffer.wire};
    }
    distributed::wait(pg_->allreduce(wire), buffer.description);
    if (compress_) buffer.flat.copy_(buffer.wire);
    for (size_t k = 0; k < buffer.members.size(); ++k)
      params_[buffer.members[k]].mutable_grad().copy_(slots[k]);
  }
}

}  // namespace fabric::strategies
