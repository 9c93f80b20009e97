#include "examples/gpt_pipeline.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "fabric/checkpoint/state_dict.h"
#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "fabric/distributed/pipeline_runtime.h"
#include "fabric/distributed/pipeline_schedule.h"
#include "fabric/distributed/process_group.h"
#include "fabric/training/optimizers.h"

namespace examples::gpt {

namespace {

void check_context_parallel_keys(const fabric::Config& c, const ModelChoice& m) {
  const int64_t cp = c.get_int("fabric.model_parallel.context_parallel_size");
  const std::string why =
      " under context parallelism (fabric.model_parallel.context_parallel_size " +
      std::to_string(cp) + ")";
  if (m.window % (2 * cp) != 0)
    throw c.error_at("model.block_size", std::to_string(m.window) +
                                             " tokens per sequence do not split into 2 x " +
                                             std::to_string(cp) + " equal chunks" + why +
                                             "; use a multiple of " + std::to_string(2 * cp));
  if (!m.is_llama() && m.gpt.dropout > 0)
    throw c.error_at("model.dropout", "not supported" + why +
                                          " (attention dropout does not run in the ring); "
                                          "set it to 0");
  if (c.get_bool("fabric.model_parallel.sequence_parallel"))
    throw c.error_at("fabric.model_parallel.sequence_parallel",
                     "not supported yet" + why + "; set it to false");
  if (c.is_auto("data.batch_size"))
    throw c.error_at("data.batch_size", "auto is not searched" + why + "; give a number");
}

}  // namespace

void check_parallel_keys(const fabric::Config& c, const ModelChoice& m) {
  if (c.get_string("fabric.strategy") != "model_parallel") return;
  if (c.get_int("fabric.model_parallel.context_parallel_size") > 1)
    check_context_parallel_keys(c, m);
  // Sequence parallelism cuts each training sequence into tp equal parts (padding it would run
  // past the model's positions at the first forward).
  const char* tp_key = "fabric.model_parallel.tensor_parallel_size";
  if (c.get_bool("fabric.model_parallel.sequence_parallel") && !c.is_auto(tp_key) &&
      c.get_int(tp_key) > 1 && m.window % c.get_int(tp_key) != 0)
    throw c.error_at("model.block_size", std::to_string(m.window) + " is not a multiple of " +
                                             tp_key + " " + std::to_string(c.get_int(tp_key)) +
                                             ": sequence parallelism cuts every sequence into "
                                             "that many equal parts; give a multiple of it");
  const int64_t pp = c.get_int("fabric.model_parallel.pipeline_parallel_size");
  if (pp == 1) return;
  const int64_t blocks = m.is_llama() ? m.pretrained->llama->num_hidden_layers : m.gpt.n_layer;
  try {
    fabric::distributed::split_stage_units(
        blocks, pp * c.get_int("fabric.pipeline.virtual_stages"),
        c.get_string("model.pretrained").empty() ? "model.n_layer" : "num_hidden_layers");
  } catch (const fabric::Error& e) {
    throw c.error_at("fabric.model_parallel.pipeline_parallel_size", e.what());
  }
  const std::string why =
      " under pipeline parallelism (fabric.model_parallel.pipeline_parallel_size " +
      std::to_string(pp) + ")";
  if (c.is_auto("data.batch_size"))
    throw c.error_at("data.batch_size", "auto is not searched" + why +
                                            "; give a multiple of fabric.pipeline.micro_batches");
  const int64_t v = c.get_int("fabric.pipeline.virtual_stages");
  const int64_t micro =
      fabric::distributed::resolve_micro_batches(c.get_int("fabric.pipeline.micro_batches"), pp, v);
  try {
    (void)fabric::distributed::split_micro_batches(torch::empty({c.get_int("data.batch_size"), 0}),
                                                   micro);
  } catch (const fabric::Error& e) {
    throw c.error_at("data.batch_size", e.what());
  }
  if (c.get_int("trainer.accumulate_grad_batches") > 1)
    throw c.error_at("trainer.accumulate_grad_batches",
                     std::to_string(c.get_int("trainer.accumulate_grad_batches")) + why +
                         ": the micro-batches are the accumulation; set it to 1 and "
                         "fabric.pipeline.micro_batches (and data.batch_size) instead");
  if (!c.get_string_list("model.activation_checkpointing").empty())
    throw c.error_at("model.activation_checkpointing", "not supported yet" + why + "; remove it");
  if (c.get_bool("fabric.model_parallel.sequence_parallel"))
    throw c.error_at("fabric.model_parallel.sequence_parallel",
                     "not supported yet" + why + "; set it to false");
  if (c.get_bool("fabric.empty_init"))
    throw c.error_at("fabric.empty_init", "not supported yet" + why + "; set it to false");
  if (c.get_string("fabric.precision").rfind("16-mixed", 0) == 0)
    throw c.error_at("fabric.precision",
                     "16-mixed's loss scaling is not supported yet" + why + "; use bf16-mixed");
  if (c.get_double("trainer.gradient_clip_val") > 0 &&
      c.get_string("trainer.gradient_clip_algorithm") != "norm")
    throw c.error_at("trainer.gradient_clip_algorithm",
                     c.get_string("trainer.gradient_clip_algorithm") + " is not supported" + why +
                         "; clip by norm (the norm is taken over every stage)");
}

Pipeline::Pipeline(fabric::Fabric& f, int64_t batch_size, int64_t window, int64_t width)
    : f_(f), options_(f.pipeline_options()) {
  // The batch must split into equal micro-batches (one activation shape for all).
  (void)fabric::distributed::split_micro_batches(torch::empty({batch_size, 0}),
                                                 options_.micro_batches);
  options_.activation_sizes = {batch_size / options_.micro_batches, window, width};
  options_.activation_dtype = f.precision().param_dtype();
  runner_ = std::make_unique<fabric::distributed::PipelineRunner>(f.strategy().pipeline_group(),
                                                                  options_);
  clip_ = f.config().get_double("trainer.gradient_clip_val");
}

void Pipeline::describe(torch::nn::Module& stages, int64_t parameters) {
  int64_t held = 0;
  for (const auto& p : stages.parameters()) held += p.numel();
  const auto all = f_.all_gather(torch::tensor({held}).to(f_.device()));
  const int64_t pp = runner_->size(), per_stage = f_.world_size() / pp;  // pp outermost
  std::string counts;
  int64_t sum = 0;
  for (int64_t k = 0; k < pp; ++k) {
    const int64_t n = all[k * per_stage].item<int64_t>();
    counts += (k ? " / " : "") + std::to_string(n);
    sum += n;
  }
  const auto& o = options_;
  f_.print("pipeline: ", runner_->stages(), " stages over pp ", pp, ", ",
           fabric::distributed::pipeline_schedule_name(o.schedule), ", ", o.micro_batches,
           " micro-batches of ", o.activation_sizes[0], " sequences; parameters per pp rank ",
           counts, " of the model's ", parameters,
           sum > parameters ? " (the tied embedding on the first and the last)" : "");
}

fabric::distributed::PipelineOptions Pipeline::options_for(int64_t rows, bool train) const {
  using fabric::distributed::PipelineSchedule;
  fabric::distributed::PipelineOptions o = options_;
  const int64_t pp = runner_->size(), v = o.virtual_stages;
  // Training keeps the schedule and the micro-batch count where they fit; evaluation has no
  // backward to order, so as few micro-batches as the stages allow.
  std::vector<PipelineSchedule> schedules{train   ? o.schedule
                                          : v > 1 ? PipelineSchedule::kInterleavedOneFOneB
                                                  : PipelineSchedule::kGPipe};
  if (v == 1) schedules.push_back(PipelineSchedule::kGPipe);  // no bound on micro-batches
  const int64_t target = train ? o.micro_batches : (v > 1 ? pp : 1);
  for (const PipelineSchedule schedule : schedules) {
    int64_t best = 0;
    for (int64_t d = 1; d <= rows; ++d) {
      if (rows % d != 0 || (best > 0 && std::abs(d - target) >= std::abs(best - target))) continue;
      try {
        (void)fabric::distributed::pipeline_actions(schedule, 0, pp, d, v);
        best = d;
      } catch (const fabric::Error&) {
      }
    }
    if (best > 0) {
      o.schedule = schedule;
      o.micro_batches = best;
      o.activation_sizes[0] = rows / best;
      return o;
    }
  }
  throw fabric::Error("gpt: a batch of " + std::to_string(rows) +
                      " rows splits into no micro-batch count the pipeline can run (" +
                      fabric::distributed::pipeline_schedule_name(o.schedule) + ", " +
                      std::to_string(pp) + " ranks, " + std::to_string(v) +
                      " virtual stages); set data.drop_last: true, or a data.batch_size that is a "
                      "multiple of fabric.pipeline.micro_batches and no smaller last batch");
}

int64_t Pipeline::evaluation_rows(int64_t rows) const {
  // Within pp x virtual_stages rows of `rows` some count splits (a multiple of both).
  const int64_t most = rows + runner_->size() * options_.virtual_stages;
  for (int64_t n = rows; n <= most; ++n) {
    try {
      (void)options_for(n, /*train=*/false);
      return n;
    } catch (const fabric::Error&) {
    }
  }
  return rows;  // cut() then throws options_for's error, naming the numbers
}

torch::Tensor Pipeline::every_row(const fabric::distributed::PipelineRunner& runner, int64_t rows) {
  torch::Tensor all =
      runner.holds_last()
          ? torch::cat(row_losses_)
          : torch::empty({rows}, torch::TensorOptions().dtype(torch::kFloat).device(f_.device()));
  if (runner.size() > 1) {
    std::vector<torch::Tensor> t = {all};
    c10d::BroadcastOptions o;
    o.rootRank = static_cast<int>((runner.stages() - 1) % runner.size());
    fabric::distributed::wait(f_.strategy().pipeline_group()->broadcast(t, o),
                              "pipeline: broadcast of the validation losses");
    all = t[0];
  }
  return all;
}

fabric::distributed::PipelineRunner& Pipeline::cut(const torch::Tensor& x, const torch::Tensor& y,
                                                   bool train) {
  const int64_t rows = x.size(0);
  fabric::distributed::PipelineRunner* r = runner_.get();
  if (!train || rows != options_.activation_sizes[0] * options_.micro_batches) {
    auto& other = others_[{train, rows}];
    if (!other)
      other = std::make_unique<fabric::distributed::PipelineRunner>(f_.strategy().pipeline_group(),
                                                                    options_for(rows, train));
    r = other.get();
  }
  xs_ = fabric::distributed::split_micro_batches(x, r->options().micro_batches);
  ys_ = fabric::distributed::split_micro_batches(y, r->options().micro_batches);
  return *r;
}

torch::Tensor Pipeline::step(fabric::distributed::PipelineRunner& runner,
                             const fabric::distributed::PipelineStageCalls& calls,
                             const torch::Tensor& tied, torch::nn::Module& stages,
                             torch::optim::Optimizer& optimizer) {
  optimizer.zero_grad();
  const torch::Tensor loss = f_.pipeline_backward(runner, calls, tied);
  if (clip_ > 0) f_.clip_gradients(stages, optimizer, clip_);
  f_.step(optimizer);
  return loss;
}

void keep_held(fabric::StateDict& tensors, torch::nn::Module& stages) {
  std::set<std::string> held;
  for (const auto& item : fabric::state_dict(stages)) held.insert(item.first);
  std::erase_if(tensors, [&](const auto& item) { return !held.count(item.first); });
}

void check_stage_groups(fabric::Fabric& f, torch::nn::Module& stages) {
  const fabric::Config& c = f.config();
  std::string kinds;
  for (const auto& g : fabric::group_parameters(stages, fabric::param_group_rules(c),
                                                /*require_matches=*/false)) {
    char text[64];
    std::snprintf(text, sizeof(text), "%s(lr x%g, %s)", kinds.empty() ? "" : ", ", g.lr_scale,
                  g.weight_decay ? "decay" : "no decay");
    kinds += text;
  }
  const std::string first = f.broadcast(kinds, 0);
  const auto odd = static_cast<int64_t>(f.all_reduce(
      kinds == first ? static_cast<double>(f.world_size()) : static_cast<double>(f.global_rank()),
      fabric::ReduceOp::kMin));
  if (odd == f.world_size()) return;
  const std::string theirs = f.broadcast(kinds, odd);
  throw c.error_at(
      c.get_string_list("optimizer.no_weight_decay").empty() ? "optimizer.lr_scale"
                                                             : "optimizer.no_weight_decay",
      "under pipeline parallelism every stage needs the same parameter groups in the same order "
      "(checkpoints join them by position): rank 0's stages have " +
          first + ", rank " + std::to_string(odd) + "'s " + theirs +
          "; use selectors that match parameters of every stage (\"*.bias\", \"type:*Norm*\") "
          "or none");
}

void load_stage_weights(fabric::Fabric& f, torch::nn::Module& stages, const std::string& path) {
  const fabric::Config& c = f.config();
  const std::filesystem::path file = fabric::absolute_from_working_directory(path);
  fabric::StateDict tensors;
  try {
    tensors = fabric::load_state_dict_file(file);
  } catch (const fabric::Error& e) {
    throw c.error_at("model.init_weights", e.what());
  }
  // Which of the file's tensors some rank's stages hold (1), over every rank.
  const size_t all = tensors.size();
  std::set<std::string> held;
  for (const auto& item : fabric::state_dict(stages)) held.insert(item.first);
  std::vector<float> mine(all);
  for (size_t i = 0; i < all; ++i) mine[i] = held.count(tensors[i].first) ? 1.0F : 0.0F;
  const torch::Tensor used =
      f.all_reduce(torch::tensor(mine).to(f.device()), fabric::ReduceOp::kMax).to(torch::kCPU);
  std::string strays;
  int64_t stray_count = 0;
  for (size_t i = 0; i < all; ++i)
    if (used[static_cast<int64_t>(i)].item<float>() == 0 && stray_count++ < 3)
      strays += (strays.empty() ? "" : ", ") + tensors[i].first;
  if (stray_count > 0)
    throw c.error_at("model.init_weights", file.string() + ": " + std::to_string(stray_count) +
                                               " tensor(s) no pipeline stage holds (" + strays +
                                               "): the weights of another model?");
  keep_held(tensors, stages);
  try {
    f.load_weights(stages, tensors, file.string());
  } catch (const fabric::ConfigError&) {
    throw;
  } catch (const fabric::Error& e) {
    throw c.error_at("model.init_weights", e.what());
  }
  f.print("model.init_weights: loaded ", file.string(), " into the pipeline's stages");
}

}  // namespace examples::gpt
