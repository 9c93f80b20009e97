#include "fabric/graphed_step.h"

#include <torch/types.h>

#ifdef FABRIC_WITH_CUDA
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <memory>
#include <sstream>
#include <string>
#include <utility>

#include "fabric/connector.h"
#include "fabric/core/error.h"
#include "fabric/core/scaled_step.h"
#include "fabric/fabric.h"
#include "fabric/nn/fp8.h"
#include "fabric/training/clip.h"

namespace fabric {

#ifdef FABRIC_WITH_CUDA
namespace {

std::string shapes_of(const std::vector<torch::Tensor>& batch) {
  std::ostringstream out;
  for (size_t i = 0; i < batch.size(); ++i)
    out << (i ? " " : "") << batch[i].sizes() << " " << batch[i].dtype();
  return out.str();
}

}  // namespace

struct GraphedStep::Graph {
  explicit Graph(c10::DeviceIndex device)
      : graph(std::make_unique<at::cuda::CUDAGraph>()),
        side(c10::cuda::getStreamFromPool(false, device)),
        device(device) {}
  std::unique_ptr<at::cuda::CUDAGraph> graph;  // replaced after a failed capture
  c10::cuda::CUDAStream side;                  // warm-up and capture (never the default stream)
  c10::DeviceIndex device;
  bool captured = false;
  std::vector<torch::Tensor> inputs;  // static copies the graph reads
  torch::Tensor loss;                 // static output the graph writes
  torch::Tensor grad_norm;            // with clip_norm: the norm the graph writes
  std::string input_shapes;

  // Runs `work` on the side stream, ordered after and before the current stream's work.
  template <typename Work>
  void on_side_stream(Work&& work) {
    c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(side);
    {
      c10::cuda::CUDAStreamGuard guard(side);
      work();
    }
    at::cuda::CUDAEvent done;
    done.record(side);
    done.block(current);
  }
};
#else
struct GraphedStep::Graph {};
#endif

GraphedStep::GraphedStep(Fabric& fabric, torch::optim::Optimizer& optimizer, LossFunction loss,
                         GraphedStepOptions options)
    : fabric_(fabric),
      optimizer_(optimizer),
      loss_(std::move(loss)),
      options_(options),
      enabled_(fabric.setup_info().cuda_graphs) {
  if (!loss_) throw Error("GraphedStep: no loss function");
  if (!(options_.clip_norm() >= 0) || !(options_.clip_value() >= 0) ||
      (options_.clip_norm() > 0 && options_.clip_value() > 0))
    throw Error(
        "GraphedStep: clip_norm and clip_value must be >= 0, and at most one of them > 0 (got " +
        std::to_string(options_.clip_norm()) + " and " + std::to_string(options_.clip_value()) +
        ")");
  if (options_.clip_norm() > 0 || options_.clip_value() > 0) {
    for (const auto& group : optimizer_.param_groups())
      clipped_.insert(clipped_.end(), group.params().begin(), group.params().end());
  }
  if (options_.warmup_steps() < 1) options_.warmup_steps(1);  // the capture needs made state
  if (!enabled_) return;
  scaled_ = dynamic_cast<ScaledStep*>(&optimizer_);
  if (scaled_ == nullptr || !scaled_->takes_grad_scale())
    throw Error(
        "fabric.cuda_graphs: the optimizer must be fabric::SGD, fabric::Adam or fabric::AdamW with "
        "the fused implementation (optimizer.implementation: auto or fused), whose step reads the "
        "learning rate and the loss scale on the device; or set fabric.cuda_graphs: false");
#ifdef FABRIC_WITH_CUDA
  scaled_->set_device_lr(true);
  fabric.strategy().set_capturable_gradient_sync(true);  // ddp: all-reduce after backward
  const torch::Device device = fabric.device();
  graph_ =
      std::make_unique<Graph>(device.has_index() ? device.index() : c10::cuda::current_device());
#else
  throw Error("fabric.cuda_graphs: this build has no CUDA (built with --config=cpu_only)");
#endif
}

GraphedStep::~GraphedStep() {
  if (scaled_ == nullptr) return;
  scaled_->set_device_lr(false);
  fabric_.strategy().set_capturable_gradient_sync(false);
}

void GraphedStep::backward_and_step(const torch::Tensor& loss) {
  fabric_.backward(loss);
  clip_and_step();
}

void GraphedStep::clip_and_step() {
  if (options_.clip_norm() > 0 || options_.clip_value() > 0) {
    fabric_.precision().unscale_gradients(optimizer_);  // on the device (fabric/precision)
    // Through the strategy: under fsdp and ZeRO-1 the optimizer holds this rank's pieces only,
    // and the norm must cover every rank's (collective).
    if (options_.clip_norm() > 0) {
      grad_norm_ = fabric_.strategy().clip_gradients_norm(
          clipped_, optimizer_, options_.clip_norm(), options_.norm_type());
    } else {
      fabric_.strategy().clip_gradients_value(clipped_, optimizer_, options_.clip_value());
    }
  }
  fabric_.step(optimizer_);
}

void GraphedStep::discard_capture() {
#ifdef FABRIC_WITH_CUDA
  Graph& g = *graph_;
  try {
    g.graph->capture_end();  // ends the stream's capture mode; throws for an invalidated capture
  } catch (...) {
  }
  // Nothing of the failed capture stays: no gradient, loss or norm points into its memory pool,
  // the pool goes with the graph, and the next call captures again from scratch.
  optimizer_.zero_grad();
  g.loss = torch::Tensor();
  g.grad_norm = torch::Tensor();
  grad_norm_ = torch::Tensor();
  g.inputs.clear();
  g.input_shapes.clear();
  try {
    g.graph->reset();
  } catch (...) {
  }
  g.graph = std::make_unique<at::cuda::CUDAGraph>();
  (void)cudaGetLastError();  // a capture error is not sticky; clear it for the next CUDA check
#endif
}

torch::Tensor GraphedStep::eager(const std::vector<torch::Tensor>& batch) {
  optimizer_.zero_grad();
  torch::Tensor loss = loss_(batch);
  backward_and_step(loss);
  ++eager_;
  return loss.detach();
}

torch::Tensor GraphedStep::operator()(const std::vector<torch::Tensor>& batch, MicroBatch micro) {
  if (micro.count == 1 && micro.index == 0) return (*this)(batch);
  if (enabled_) {
    throw Error(
        "fabric.cuda_graphs: a step over several micro-batches (trainer.accumulate_grad_batches "
        "> 1) cannot be captured yet; set fabric.cuda_graphs: false or "
        "trainer.accumulate_grad_batches: 1");
  }
  if (micro.first()) optimizer_.zero_grad();
  torch::Tensor loss = loss_(batch);
  fabric_.backward(loss, micro);  // checks the index
  if (micro.last()) {
    clip_and_step();
    ++eager_;
  }
  return loss.detach();
}

torch::Tensor GraphedStep::operator()(const std::vector<torch::Tensor>& batch) {
  if (!enabled_) return eager(batch);
#ifdef FABRIC_WITH_CUDA
  Graph& g = *graph_;
  scaled_->refresh_lr();  // before the step reads it, eager or replayed
  if (!g.captured && eager_ < options_.warmup_steps()) {
    torch::Tensor loss;
    g.on_side_stream([&] { loss = eager(batch); });
    return loss.clone();  // made on the current stream
  }
  if (!g.captured) {
    for (const auto& t : batch) g.inputs.push_back(t.clone());
    g.input_shapes = shapes_of(batch);
    optimizer_.zero_grad();  // to none: the gradients will live in the graph's memory
    const bool autocast_cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);  // no casts cached across the capture
    g.on_side_stream([&] {
      // Thread-local capture mode: the loader's worker threads may pin memory and copy batches
      // on their own streams meanwhile; in the default global mode such calls from any thread
      // invalidate the capture. Only this thread's calls are checked.
      g.graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        torch::Tensor loss = loss_(g.inputs);
        backward_and_step(loss);
        g.loss = loss.detach();
        g.grad_norm = grad_norm_;
        g.graph->capture_end();
      } catch (const std::exception& e) {
        discard_capture();
        at::autocast::set_autocast_cache_enabled(autocast_cache);
        std::string why = e.what();
        why = one_line(why.substr(0, why.find('\n')), 200);
        throw Error("fabric.cuda_graphs: the training step cannot be captured as a CUDA graph (" +
                    why +
                    "); a step that waits for the host (.item(), printing a tensor, CPU tensors "
                    "in the loss) cannot be: move that out of the loss function, or set "
                    "fabric.cuda_graphs: false");
      }
    });
    at::autocast::set_autocast_cache_enabled(autocast_cache);
    g.captured = true;
  } else {
    bool same = batch.size() == g.inputs.size();
    for (size_t i = 0; same && i < batch.size(); ++i)
      same = batch[i].sizes() == g.inputs[i].sizes() &&
             batch[i].scalar_type() == g.inputs[i].scalar_type() &&
             batch[i].device() == g.inputs[i].device();
    if (!same) {
      if (!warned_shape_) {
        fabric_.print("warning: fabric.cuda_graphs: a batch of ", shapes_of(batch),
                      " ran eagerly: the graph was captured for ", g.input_shapes,
                      " (data.drop_last: true keeps every batch the same size)");
        warned_shape_ = true;
      }
      torch::Tensor loss;
      g.on_side_stream([&] { loss = eager(batch); });
      return loss.clone();
    }
    for (size_t i = 0; i < batch.size(); ++i) g.inputs[i].copy_(batch[i], /*non_blocking=*/true);
  }
  g.graph->replay();  // the capture recorded the step without running it: this runs it
  // The replay wrote the weights with no host code run (no Fabric::step, no version bumps): the
  // float8 casts kept of them (fabric/nn/fp8.h) go.
  fabric::nn::release_fp8_weights();
  grad_norm_ = g.grad_norm;  // an eager step in between may have pointed it elsewhere
  scaled_->steps_ran_on_device();
  ++replays_;
  return g.loss.clone();
#else
  return eager(batch);
#endif
}

}  // namespace fabric
