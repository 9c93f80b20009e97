// examples/gpt under pipeline parallelism (fabric.strategy: model_parallel with
// fabric.model_parallel.pipeline_parallel_size > 1; docs/tensor_parallel.md): each rank builds
// the whole model, keeps the stages its pipeline rank holds (fabric::models::GPTStages or
// LlamaStages; the rest is freed) and sets those up; every batch is cut into
// fabric.pipeline.micro_batches micro-batches that run through the stages in the schedule's
// order (fabric::distributed::PipelineRunner through Fabric::pipeline_backward), then the
// gradients are clipped over the whole pipeline and each rank steps its stages' optimizer.
// Validation runs the forwards only. Checkpoints hold the whole model's state (each stage's
// tensors and optimizer state under the whole model's names: fabric/checkpoint/pipeline_state.h)
// and resume at any pp size; checkpoint.export_weights writes the whole model, joined on rank 0.
#ifndef EXAMPLES_GPT_PIPELINE_H_
#define EXAMPLES_GPT_PIPELINE_H_

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "examples/gpt_recipe.h"
#include "fabric/config/config.h"
#include "fabric/distributed/pipeline_runtime.h"
#include "fabric/fabric.h"

namespace examples::gpt {

// What a pipeline run cannot take, refused before any process starts (ConfigError at the key):
// data.batch_size auto, trainer.accumulate_grad_batches > 1 (the micro-batches are the
// accumulation), model.activation_checkpointing, sequence parallelism, fp16 loss scaling,
// fabric.empty_init, gradient clipping by value; and the model's blocks that the stages
// (pipeline_parallel_size x virtual_stages) do not divide. Under context parallelism
// (fabric.model_parallel.context_parallel_size > 1): a window 2 x cp does not divide, dropout,
// sequence parallelism, data.batch_size auto.
void check_parallel_keys(const fabric::Config& c, const ModelChoice& m);

class Pipeline {
 public:
  // This rank's runner: Fabric::pipeline_options with activations of {batch_size / m, window,
  // width} in the precision's parameter dtype.
  Pipeline(fabric::Fabric& f, int64_t batch_size, int64_t window, int64_t width);

  fabric::distributed::PipelineRunner& runner() { return *runner_; }
  // Prints (rank 0) the schedule and each stage's parameters against the model's `parameters`:
  // "pipeline: 2 stages over pp 2, 1f1b, 4 micro-batches of 2 sequences; parameters per pp rank
  // 437504 / 429568 of the model's 834304 (...)". Collective; before setup (whole shapes).
  void describe(torch::nn::Module& stages, int64_t parameters);

  // One optimizer step on the batch (x, y): zero_grad, the micro-batches through the stages,
  // trainer.gradient_clip_val by norm over the pipeline, Fabric::step. The mean loss.
  // A batch of other rows than data.batch_size (an epoch's last) runs in as many micro-batches
  // as divide it, nearest fabric.pipeline.micro_batches (options_for).
  template <typename Stages>
  torch::Tensor train(Stages& stages, torch::optim::Optimizer& optimizer, const torch::Tensor& x,
                      const torch::Tensor& y) {
    fabric::distributed::PipelineRunner& r = cut(x, y, /*train=*/true);
    return step(r, calls(stages), stages->tied_weight(), *stages, optimizer);
  }
  // Each sequence's mean loss, [rows] on every rank (collective over the pipeline), forwards
  // only: the batch whole (with virtual stages: in pipeline_parallel_size micro-batches). A batch
  // no micro-batch count splits (an epoch's short last one under interleaved_1f1b) is run with
  // its last row repeated up to the next count that splits, and the copies' losses left out.
  // Per sequence, so that Fabric::evaluate leaves out the sampler's padding rows exactly.
  template <typename Stages>
  torch::Tensor evaluate(Stages& stages, const torch::Tensor& x, const torch::Tensor& y) {
    const int64_t rows = x.size(0), runnable = evaluation_rows(rows);
    torch::Tensor xs = x, ys = y;
    if (runnable > rows) {
      const torch::Tensor pick =
          torch::arange(runnable, torch::TensorOptions().dtype(torch::kLong).device(x.device()))
              .clamp_max(rows - 1);
      xs = x.index_select(0, pick);
      ys = y.index_select(0, pick);
    }
    fabric::distributed::PipelineRunner& r = cut(xs, ys, /*train=*/false);
    fabric::distributed::PipelineStageCalls c = calls(stages);
    row_losses_.assign(xs_.size(), torch::Tensor());
    c.loss = [this, &stages](int64_t mb, const torch::Tensor& out) {
      const torch::Tensor& targets = ys_[static_cast<size_t>(mb)];
      std::vector<torch::Tensor> each;
      for (int64_t i = 0; i < out.size(0); ++i)
        each.push_back(
            stages->loss(out.slice(0, i, i + 1), targets.slice(0, i, i + 1)).reshape({1}));
      row_losses_[static_cast<size_t>(mb)] = torch::cat(each).to(torch::kFloat);
      return row_losses_[static_cast<size_t>(mb)].mean();
    };
    r.evaluate(c);
    return every_row(r, runnable).slice(0, 0, rows);
  }

 private:
  template <typename Stages>
  fabric::distributed::PipelineStageCalls calls(Stages& stages) {
    fabric::distributed::PipelineStageCalls c;
    c.forward = [this, &stages](int64_t k, int64_t mb, const torch::Tensor& in) {
      return stages->forward(k, k == 0 ? xs_[static_cast<size_t>(mb)] : in);
    };
    c.loss = [this, &stages](int64_t mb, const torch::Tensor& out) {
      return stages->loss(out, ys_[static_cast<size_t>(mb)]);
    };
    return c;
  }
  // The runner's options for a batch of `rows` other than data.batch_size's (an epoch's last) or
  // for evaluation: the micro-batch count nearest the configured one that divides the rows and
  // the schedule allows (else GPipe's); fabric::Error when none does.
  fabric::distributed::PipelineOptions options_for(int64_t rows, bool train) const;
  // The fewest rows at or above `rows` an evaluation runner can split (rows itself when it can).
  int64_t evaluation_rows(int64_t rows) const;
  // The last stage's row_losses_ joined ([rows], float32), broadcast over the pipeline.
  torch::Tensor every_row(const fabric::distributed::PipelineRunner& runner, int64_t rows);
  // (x, y) cut into the micro-batches of the runner for their rows (made on first use).
  fabric::distributed::PipelineRunner& cut(const torch::Tensor& x, const torch::Tensor& y,
                                           bool train);
  torch::Tensor step(fabric::distributed::PipelineRunner& runner,
                     const fabric::distributed::PipelineStageCalls& calls,
                     const torch::Tensor& tied, torch::nn::Module& stages,
                     torch::optim::Optimizer& optimizer);

  fabric::Fabric& f_;
  fabric::distributed::PipelineOptions options_;  // data.batch_size's, for training
  std::unique_ptr<fabric::distributed::PipelineRunner> runner_;
  // Runners for other rows: (train, rows) → runner.
  std::map<std::pair<bool, int64_t>, std::unique_ptr<fabric::distributed::PipelineRunner>> others_;
  double clip_ = 0;
  std::vector<torch::Tensor> xs_, ys_;     // this batch's micro-batches
  std::vector<torch::Tensor> row_losses_;  // evaluate, on the last stage: each micro-batch's
};

// The tensors of `tensors` that `stages` (this rank's) hold; the others dropped.
void keep_held(fabric::StateDict& tensors, torch::nn::Module& stages);

// ConfigError at optimizer.no_weight_decay (or lr_scale), on every rank and before training, when
// the stages' parameter groups differ (a selector matching one stage's parameters only):
// checkpoints join the stages' optimizers group by group. Collective.
void check_stage_groups(fabric::Fabric& f, torch::nn::Module& stages);

// model.init_weights under pp (`path`, a whole model's file: one process's weights or a pp run's
// export): each rank loads its stages' tensors; a tensor no rank's stages hold (the file of
// another model) is a ConfigError at the key on every rank. Collective.
void load_stage_weights(fabric::Fabric& f, torch::nn::Module& stages, const std::string& path);

}  // namespace examples::gpt

#endif  // EXAMPLES_GPT_PIPELINE_H_
